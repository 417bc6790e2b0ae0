package actors

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// A reader's held events stay the window's, in order, as the finished
// prefix is cut off their front and new ones are taken: held moves to
// its array's start when it reaches the end, grows when it does not fit,
// and the array keeps no event it no longer holds.
func TestHeldEventsStayInOrderAsThePrefixIsCutOff(t *testing.T) {
	var w windowed
	next, first := int64(1), int64(1) // the next position to take; the first held
	take := func(n int) {
		evs := make([]eventsource.RecordedEvent, n)
		for i := range evs {
			evs[i] = eventsource.RecordedEvent{Position: next, Stream: "s"}
			next++
		}
		w.hold(evs)
	}
	drop := func(n int) {
		clear(w.held[:n])
		w.held = w.held[n:]
		first += int64(n)
	}
	check := func() {
		t.Helper()
		require.Len(t, w.held, int(next-first))
		for i, e := range w.held {
			require.Equal(t, first+int64(i), e.Position)
		}
		live := 0
		for _, e := range w.hbuf[:cap(w.hbuf)] {
			if e.Position != 0 {
				live++
			}
		}
		require.Equal(t, len(w.held), live, "the array holds only the held events")
	}
	for round := range 200 {
		take(1 + round%5)
		check()
		drop(min(len(w.held), 1+round%4))
		check()
		if round%37 == 0 {
			take(40) // more than the array holds
			check()
		}
	}
}
