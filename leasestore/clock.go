package leasestore

import (
	"sync"
	"time"
)

// Clock is what [Store.EnsureHeld] judges the age of a renewal by: the
// larger of the ages its two readings give. Only differences between
// readings matter; it is never compared with the database's clock, which
// alone judges expiry.
type Clock interface {
	// Now is a reading that wall-clock steps do not move: time.Now's
	// monotonic reading, which stands still while the host (or VM) is
	// suspended.
	Now() time.Time
	// Boottime is a reading of a clock that keeps counting while the host
	// is suspended: CLOCK_BOOTTIME on Linux, which wall-clock steps do not
	// move either; the wall clock elsewhere (where a forward step can make
	// EnsureHeld fail early, never pass late).
	Boottime() time.Duration
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Boottime returns CLOCK_BOOTTIME on Linux, the wall clock elsewhere.
func (SystemClock) Boottime() time.Duration { return boottime() }

// ManualClock is a [Clock] that moves only when told, for tests of
// EnsureHeld's margin without sleeping. It is safe for concurrent use.
type ManualClock struct {
	mu   sync.Mutex
	now  time.Time
	boot time.Duration
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
	c.boot += d
}

// Boottime returns the clock's reading of time including suspensions.
func (c *ManualClock) Boottime() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.boot
}

// Suspend moves only the clock that counts a suspended host forward by d:
// the host slept for d, and the monotonic reading stood still.
func (c *ManualClock) Suspend(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.boot += d
}

// usableFor is how long after a renewal STARTED EnsureHeld keeps passing:
// ttl - margin. The renewal's expiry, judged by the database from a moment
// no earlier than that start, is then still at least margin away.
func usableFor(ttl, margin time.Duration) time.Duration { return ttl - margin }

// reading is one moment by both of a [Clock]'s clocks.
type reading struct {
	mono time.Time
	boot time.Duration
}

func readClock(c Clock) reading { return reading{mono: c.Now(), boot: c.Boottime()} }

// add moves both readings by d.
func (r reading) add(d time.Duration) reading { return reading{mono: r.mono.Add(d), boot: r.boot + d} }

// older returns, clock by clock, the earlier of r and o.
func (r reading) older(o reading) reading {
	if o.mono.Before(r.mono) {
		r.mono = o.mono
	}
	r.boot = min(r.boot, o.boot)
	return r
}

// since is how long before now r was: the larger of the two clocks' ages,
// so that a suspension (which only the boot clock counts) ages a renewal.
func (r reading) since(now reading) time.Duration { return max(now.mono.Sub(r.mono), now.boot-r.boot) }

// renewalFresh reports whether a lease last renewed by a renewal that
// started at renewedAt may still be used at now.
func renewalFresh(renewedAt, now reading, usable time.Duration) bool {
	return renewedAt.since(now) < usable
}

// wallClock reads the wall clock, which counts a suspended host's sleep.
func wallClock() time.Duration { return time.Duration(time.Now().UnixNano()) }
