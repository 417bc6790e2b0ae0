package leasestore

import (
	"time"
)

// clock is what [Store.EnsureHeld] judges the age of a renewal by: the
// larger of the ages its two readings give. Only differences between
// readings matter; it is never compared with the database's clock, which
// alone judges expiry.
type clock interface {
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

// systemClock is the real clock.
type systemClock struct{}

// Now returns time.Now().
func (systemClock) Now() time.Time { return time.Now() }

// Boottime returns CLOCK_BOOTTIME on Linux, the wall clock elsewhere.
func (systemClock) Boottime() time.Duration { return boottime() }

// reading is one moment by both of a clock's clocks.
type reading struct {
	mono time.Time
	boot time.Duration
}

func readClock(c clock) reading { return reading{mono: c.Now(), boot: c.Boottime()} }

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

// usableFor is how long after a renewal STARTED EnsureHeld keeps passing:
// ttl - margin. The renewal's expiry, judged by the database from a moment
// no earlier than that start, is then still at least margin away.
func usableFor(ttl, margin time.Duration) time.Duration { return ttl - margin }
