package supervision

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kumi-run/kumi/internal/backoff"
	"github.com/kumi-run/kumi/kumierr"
)

// Jitter is how [Backoff] randomises a delay below its ceiling.
type Jitter int

const (
	// FullJitter (the default) draws the delay uniformly from [0, ceiling):
	// restarts of many actors that failed together spread out the most.
	FullJitter Jitter = iota
	// EqualJitter draws from [ceiling/2, ceiling): never much shorter than
	// the ceiling, still spread.
	EqualJitter
	// NoJitter waits exactly the ceiling.
	NoJitter
)

// The values are internal/backoff's, which computes the delays.
var (
	_ = [1]struct{}{}[int(FullJitter)-int(backoff.Full)]
	_ = [1]struct{}{}[int(EqualJitter)-int(backoff.Equal)]
	_ = [1]struct{}{}[int(NoJitter)-int(backoff.None)]
)

var jitterNames = [...]string{"full", "equal", "none"}

// String returns "full", "equal" or "none".
func (j Jitter) String() string {
	if j < 0 || int(j) >= len(jitterNames) {
		return fmt.Sprintf("Jitter(%d)", int(j))
	}
	return jitterNames[j]
}

// Defaults for [Backoff]'s zero fields.
const (
	InitialDefault    = 100 * time.Millisecond
	MaxDefault        = 30 * time.Second
	MultiplierDefault = 2.0
)

// Backoff is an exponential backoff with jitter: attempt n (from 1) waits
// at most the ceiling min(Max, Initial·Multiplierⁿ⁻¹), randomised by
// Jitter. (protoactor's "exponential" backoff strategy grows linearly, with
// nanoseconds of jitter.) The zero value is usable: 100 ms doubling up to
// 30 s, full jitter. A Backoff is a value, safe for concurrent use if Rand
// is.
type Backoff struct {
	// Initial is the first ceiling; 0 means InitialDefault.
	Initial time.Duration
	// Max caps every delay; 0 means MaxDefault.
	Max time.Duration
	// Multiplier is the growth per attempt, at least 1; 0 means
	// MultiplierDefault.
	Multiplier float64
	// Jitter randomises each delay.
	Jitter Jitter
	// Rand returns a number in [0, 1); nil means math/rand/v2.Float64.
	// Tests inject a deterministic one.
	Rand func() float64
}

// WithDefaults returns b with zero fields replaced by their defaults.
func (b Backoff) WithDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = InitialDefault
	}
	if b.Max == 0 {
		b.Max = max(MaxDefault, b.Initial)
	}
	if b.Multiplier == 0 {
		b.Multiplier = MultiplierDefault
	}
	if b.Rand == nil {
		b.Rand = rand.Float64
	}
	return b
}

// Validate reports, as a [*kumierr.ConfigError] naming the field, what is wrong
// with b after defaults. Packages that embed a Backoff in their own
// configuration call it from their validation.
func (b Backoff) Validate() error {
	b = b.WithDefaults()
	switch {
	case b.Initial < 0:
		return &kumierr.ConfigError{Field: "supervision.Backoff.Initial", Value: b.Initial, Reason: fmt.Sprintf("is negative: use a positive duration, or 0 for %v", InitialDefault)}
	case b.Max < b.Initial:
		return &kumierr.ConfigError{Field: "supervision.Backoff.Max", Value: b.Max, Reason: fmt.Sprintf("is below Backoff.Initial (%v)", b.Initial)}
	case math.IsNaN(b.Multiplier) || math.IsInf(b.Multiplier, 0) || b.Multiplier < 1:
		return &kumierr.ConfigError{Field: "supervision.Backoff.Multiplier", Value: b.Multiplier, Reason: fmt.Sprintf("use a finite number of at least 1, or 0 for %v", MultiplierDefault)}
	case b.Jitter < FullJitter || b.Jitter > NoJitter:
		return &kumierr.ConfigError{Field: "supervision.Backoff.Jitter", Value: b.Jitter, Reason: "use FullJitter, EqualJitter or NoJitter"}
	}
	return nil
}

// Ceiling returns the largest delay of attempt (from 1; smaller counts as
// 1): min(Max, Initial·Multiplier^(attempt-1)). It never decreases as
// attempt grows and never overflows.
func (b Backoff) Ceiling(attempt int) time.Duration { return b.policy().Ceiling(attempt) }

// Next returns the delay before attempt (from 1): the attempt's
// [Backoff.Ceiling] randomised by the Jitter.
func (b Backoff) Next(attempt int) time.Duration { return b.policy().Next(attempt) }

// policy is b, with its defaults, as kumi's one backoff implementation
// (internal/backoff, which the notifier and the sequencer use too).
func (b Backoff) policy() backoff.Policy {
	b = b.WithDefaults()
	return backoff.Policy{Initial: b.Initial, Max: b.Max, Multiplier: b.Multiplier, Jitter: backoff.Jitter(b.Jitter), Rand: b.Rand}
}
