package supervision

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kumi-run/kumi/kumierr"
)

func TestBackoffCeiling(t *testing.T) {
	t.Parallel()
	b := Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Multiplier: 2}
	for _, tc := range []struct {
		attempt int
		want    time.Duration
	}{
		{-3, 100 * time.Millisecond},
		{0, 100 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{2, 200 * time.Millisecond},
		{3, 400 * time.Millisecond},
		{5, 1600 * time.Millisecond},
		{6, 2 * time.Second},
		{1 << 20, 2 * time.Second},
		{math.MaxInt, 2 * time.Second},
	} {
		if got := b.Ceiling(tc.attempt); got != tc.want {
			t.Errorf("Ceiling(%d) = %v, want %v", tc.attempt, got, tc.want)
		}
	}
	if got := (Backoff{Initial: time.Second, Multiplier: 1.5}).Ceiling(3); got != 2250*time.Millisecond {
		t.Errorf("fractional multiplier: %v", got)
	}
}

func TestBackoffCeilingsAreMonotoneAndCapped(t *testing.T) {
	t.Parallel()
	for _, b := range []Backoff{
		{},
		{Initial: time.Nanosecond, Max: time.Hour, Multiplier: 10},
		{Initial: time.Second, Max: time.Second, Multiplier: 1},
		{Initial: time.Millisecond, Max: time.Duration(math.MaxInt64), Multiplier: 3},
	} {
		max := b.WithDefaults().Max
		prev := time.Duration(0)
		for attempt := 1; attempt <= 200; attempt++ {
			c := b.Ceiling(attempt)
			if c < prev || c > max || c <= 0 {
				t.Fatalf("%+v: Ceiling(%d) = %v after %v (max %v)", b, attempt, c, prev, max)
			}
			prev = c
		}
	}
}

func TestBackoffJitter(t *testing.T) {
	t.Parallel()
	fixed := func(r float64) func() float64 { return func() float64 { return r } }
	b := Backoff{Initial: time.Second, Max: time.Minute}
	for _, tc := range []struct {
		name   string
		jitter Jitter
		rand   float64
		want   time.Duration
	}{
		{"FullAtZero", FullJitter, 0, 0},
		{"FullHalf", FullJitter, 0.5, 2 * time.Second},
		{"FullClampsOne", FullJitter, 1, 4*time.Second - 1},
		{"FullClampsNegative", FullJitter, -1, 0},
		{"FullClampsNaN", FullJitter, math.NaN(), 0},
		{"EqualAtZero", EqualJitter, 0, 2 * time.Second},
		{"EqualHalf", EqualJitter, 0.5, 3 * time.Second},
		{"None", NoJitter, 0.123, 4 * time.Second},
	} {
		b := b
		b.Jitter, b.Rand = tc.jitter, fixed(tc.rand)
		if got := b.Next(3); got != tc.want {
			t.Errorf("%s: Next(3) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestBackoffNextStaysInRange(t *testing.T) {
	t.Parallel()
	for _, j := range []Jitter{FullJitter, EqualJitter, NoJitter} {
		b := Backoff{Initial: 10 * time.Millisecond, Max: 5 * time.Second, Jitter: j} // the real random source
		for attempt := 1; attempt <= 20; attempt++ {
			c := b.Ceiling(attempt)
			lo := time.Duration(0)
			if j == EqualJitter {
				lo = c / 2
			}
			if j == NoJitter {
				lo = c
			}
			for range 200 {
				if d := b.Next(attempt); d < lo || d > c {
					t.Fatalf("%v: Next(%d) = %v outside [%v, %v]", j, attempt, d, lo, c)
				}
			}
		}
	}
}

func TestBackoffValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		b     Backoff
		field string
	}{
		{Backoff{Initial: -time.Second}, "supervision.Backoff.Initial"},
		{Backoff{Initial: time.Minute, Max: time.Second}, "supervision.Backoff.Max"},
		{Backoff{Max: -1}, "supervision.Backoff.Max"},
		{Backoff{Multiplier: 0.9}, "supervision.Backoff.Multiplier"},
		{Backoff{Multiplier: math.Inf(1)}, "supervision.Backoff.Multiplier"},
		{Backoff{Multiplier: math.NaN()}, "supervision.Backoff.Multiplier"},
		{Backoff{Jitter: 7}, "supervision.Backoff.Jitter"},
	} {
		var ce *kumierr.ConfigError
		if err := tc.b.Validate(); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.b, err, tc.field)
		}
	}
	if err := (Backoff{}).Validate(); err != nil {
		t.Errorf("zero Backoff: %v", err)
	}
	if b := (Backoff{Initial: time.Hour}).WithDefaults(); b.Max != time.Hour {
		t.Errorf("Max below a large Initial: %v", b.Max)
	}
}
