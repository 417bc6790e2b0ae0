package leasestore

import (
	"sync"
	"time"
)

// manualClock is a clock that moves only when told, for tests of
// EnsureHeld's margin without sleeping. It is safe for concurrent use.
type manualClock struct {
	mu   sync.Mutex
	now  time.Time
	boot time.Duration
}

// newManualClock returns a manualClock reading an arbitrary fixed instant.
func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now returns the clock's current reading.
func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.boot += d
}

// Boottime returns the clock's reading of time including suspensions.
func (c *manualClock) Boottime() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.boot
}

// Suspend moves only the clock that counts a suspended host forward by d:
// the host slept for d, and the monotonic reading stood still.
func (c *manualClock) Suspend(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.boot += d
}
