package leasestore

import (
	"sync"
	"time"
)

// Clock is the monotonic clock by which [Store.EnsureHeld] judges the age
// of a renewal. Only differences between its readings matter; it is never
// compared with the database's clock, which alone judges expiry.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real clock. time.Now carries a monotonic reading, so
// the differences EnsureHeld takes are immune to wall-clock steps.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// ManualClock is a [Clock] that moves only when told, for tests of
// EnsureHeld's margin without sleeping. It is safe for concurrent use.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a ManualClock reading an arbitrary fixed instant.
func NewManualClock() *ManualClock {
	return &ManualClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now returns the clock's current reading.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// usableFor is how long after a renewal STARTED EnsureHeld keeps passing:
// ttl - margin. The renewal's expiry, judged by the database from a moment
// no earlier than that start, is then still at least margin away.
func usableFor(ttl, margin time.Duration) time.Duration { return ttl - margin }

// renewalFresh reports whether a lease last renewed by a renewal that
// started at renewedAt may still be used at now.
func renewalFresh(renewedAt, now time.Time, usable time.Duration) bool {
	return now.Sub(renewedAt) < usable
}
