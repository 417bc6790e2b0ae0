package backoff

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestCeilingGrowsAndIsCapped(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}
	for attempt, want := range map[int]time.Duration{
		-1: 100 * time.Millisecond, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		4: 800 * time.Millisecond, 5: time.Second, math.MaxInt: time.Second,
	} {
		if got := p.Ceiling(attempt); got != want {
			t.Errorf("Ceiling(%d) = %v, want %v", attempt, got, want)
		}
	}
	if got := (Policy{Initial: time.Second, Max: time.Hour, Multiplier: 0.5}).Ceiling(3); got != time.Second {
		t.Errorf("a multiplier below 1 counts as 1: Ceiling(3) = %v", got)
	}
}

func TestNextStaysWithinItsJitter(t *testing.T) {
	t.Parallel()
	for _, r := range []float64{0, 0.5, 1, 2, -1, math.NaN()} {
		p := Policy{Initial: time.Second, Max: time.Second, Multiplier: 2, Rand: func() float64 { return r }}
		for j, lo := range map[Jitter]time.Duration{Full: 0, Equal: time.Second / 2, None: time.Second, Jitter(9): 0} {
			p.Jitter = j
			if d := p.Next(1); d < lo || d > time.Second {
				t.Errorf("jitter %d, rand %v: Next = %v, want in [%v, 1s]", j, r, d, lo)
			}
		}
	}
	if d := (Policy{Initial: time.Second, Max: time.Second, Jitter: Equal}).Next(1); d < time.Second/2 || d > time.Second {
		t.Errorf("the default source: Next = %v", d)
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on an ended context reported a full wait")
	}
	if !Sleep(context.Background(), time.Nanosecond) {
		t.Fatal("Sleep of 1ns did not complete")
	}
}
