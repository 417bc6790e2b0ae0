package eventsource

import (
	"errors"
	"testing"
)

func TestStepSizeHalvesOnTimeoutsAndGrowsBack(t *testing.T) {
	b := newStepSize()
	var sizes []int
	for b.timedOut() {
		sizes = append(sizes, b.n)
	}
	if b.n != 1 || len(sizes) != 12 || sizes[0] != sequencerBatchDefault/2 {
		t.Fatalf("halving from %d: %v, ends at %d; want down to 1 in 12 steps", sequencerBatchDefault, sizes, b.n)
	}
	// Partial steps say nothing about a larger batch: no growth.
	for range 3 * growAfter {
		b.done(0)
	}
	if b.n != 1 {
		t.Fatalf("grew to %d after partial steps", b.n)
	}
	steps := 0
	for b.n < sequencerBatchDefault {
		b.done(b.n)
		steps++
		if steps > 100 {
			t.Fatal("never grows back")
		}
	}
	if b.n != sequencerBatchDefault || steps != 13*growAfter {
		t.Fatalf("grew back to %d in %d full steps; want %d in %d", b.n, steps, sequencerBatchDefault, 13*growAfter)
	}
	b.done(b.n)
	if b.n != sequencerBatchDefault {
		t.Fatalf("grew past the default: %d", b.n)
	}
	if b.timeouts != 13 {
		t.Fatalf("counted %d timeouts, want 13", b.timeouts)
	}
}

func TestStripReset(t *testing.T) {
	reset := &SequenceResetError{Schema: "s", LastValue: 1, Watermark: 10}
	other := errors.New("boom")
	for _, c := range []struct {
		in, want error
	}{
		{nil, nil}, {reset, nil}, {other, other}, {errors.Join(reset, other), other},
	} {
		got := stripReset(c.in)
		if (got == nil) != (c.want == nil) || (got != nil && !errors.Is(got, c.want)) || errors.Is(got, ErrSequenceReset) {
			t.Errorf("stripReset(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
