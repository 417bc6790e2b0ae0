// Package backoff is kumi's one exponential backoff with jitter. The
// notifier's reconnections (and so the lease store's, whose wake-ups come
// from a notifier), the sequencer's retries and supervision's restarts and
// handler retries all compute their delays here; supervision.Backoff is
// the public, validated face of [Policy].
package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Jitter is how a [Policy] randomises a delay below its ceiling. The values
// match supervision.Jitter's.
type Jitter int

const (
	// Full draws the delay uniformly from [0, ceiling).
	Full Jitter = iota
	// Equal draws from [ceiling/2, ceiling).
	Equal
	// None waits exactly the ceiling.
	None
)

// Policy is an exponential backoff: attempt n (from 1) waits at most the
// ceiling min(Max, Initial·Multiplierⁿ⁻¹), randomised by Jitter. Callers
// give every field but Rand; a Multiplier below 1 counts as 1.
type Policy struct {
	Initial, Max time.Duration
	Multiplier   float64
	Jitter       Jitter
	// Rand returns a number in [0, 1); nil means math/rand/v2.Float64.
	Rand func() float64
}

// Ceiling returns the largest delay of attempt (from 1; smaller counts as
// 1). It never decreases as attempt grows and never overflows.
func (p Policy) Ceiling(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	c := float64(p.Initial) * math.Pow(max(p.Multiplier, 1), float64(attempt-1))
	if math.IsNaN(c) || c >= float64(p.Max) {
		return p.Max
	}
	return time.Duration(c)
}

// Next returns the delay before attempt (from 1): its ceiling randomised
// by the Jitter (an unknown Jitter counts as Full).
func (p Policy) Next(attempt int) time.Duration {
	c := p.Ceiling(attempt)
	switch p.Jitter {
	case None:
		return c
	case Equal:
		half := c / 2
		return half + time.Duration(p.rand()*float64(c-half))
	default:
		return time.Duration(p.rand() * float64(c))
	}
}

// rand returns Rand() clamped to [0, 1), so that a careless source cannot
// exceed the ceiling.
func (p Policy) rand() float64 {
	r := rand.Float64()
	if p.Rand != nil {
		r = p.Rand()
	}
	if !(r >= 0) { // also NaN
		return 0
	}
	return min(r, math.Nextafter(1, 0))
}

// Sleep waits d or until ctx ends, and reports whether it waited the whole
// time.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
