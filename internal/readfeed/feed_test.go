package readfeed

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

var env = Env{Published: 0, ReadAhead: 1 << 20}

// evs makes events at positions.
func evs(positions ...int64) []eventsource.RecordedEvent {
	out := make([]eventsource.RecordedEvent, len(positions))
	for i, p := range positions {
		out[i] = eventsource.RecordedEvent{Position: p, Data: make([]byte, 10)}
	}
	return out
}

func page(r *Read, events ...eventsource.RecordedEvent) Page {
	return Page{Read: r.ID, Events: events, Bytes: SizeOf(events)}
}

// Nothing is read before the checkpoint is loaded — a read from the
// cursor's zero value would queue events the checkpoint covers — whatever
// comes first, and the live queue is held meanwhile.
func TestNothingIsReadBeforeTheCheckpointIsLoaded(t *testing.T) {
	t.Parallel()
	f := New(Config{BatchSize: 10})
	require.Equal(t, Effects{Hold: true}, f.Poll(env))
	for _, e := range []Effects{
		f.Paused(env), f.Subscribed(7, env), f.Live(Batch{From: 7, To: 9, Events: evs(9)}, env),
		f.Bound(Bound{Bounded: true, Decided: true, Limit: 12}, env), f.Bound(Bound{}, env),
	} {
		require.Nil(t, e.Read, "%s", f)
	}
	require.Equal(t, Loading, f.Phase())
	e := f.Loaded(5, Env{Published: 8, ReadAhead: 100})
	require.Equal(t, &Read{ID: 1, From: 5, Target: 12, Limit: 10, MaxBytes: 100}, e.Read,
		"from the checkpoint, through what was told while loading and the publisher's position")
}

// An answer of a read given up (its call failed, and it was read again)
// is recognised by its id, whatever the order it arrives in.
func TestAnAnswerOfAReadGivenUpChangesNothing(t *testing.T) {
	t.Parallel()
	f := New(Config{BatchSize: 10})
	first := f.Loaded(0, env).Read
	second := f.ReadAgain(env).Read
	require.NotEqual(t, first.ID, second.ID)
	require.Nil(t, f.Page(page(first, evs(1, 2)...), env).Read)
	require.Empty(t, f.Pending(), "the answer of the read given up is no news")
	require.True(t, f.Reading())
	f.Page(page(second, evs(1, 2, 3)...), env)
	require.Equal(t, Live, f.Phase())
	require.Len(t, f.Pending(), 3)
	require.Equal(t, int64(3), f.Cursor())
}

// A reader bounded by a decided cut reads no page past it; the bound
// lifted, it reads on from its cursor through everything it was told of.
func TestADecidedCutCapsTheCatchUp(t *testing.T) {
	t.Parallel()
	f := New(Config{BatchSize: 10})
	far := Env{Published: 50, ReadAhead: 1 << 20}
	f.Loaded(0, far)
	f.Page(page(&Read{ID: 1}, evs(2, 4)...), far)
	require.Equal(t, Live, f.Phase())
	f.Take(2)
	f.Paused(far) // the catch-up reads from 50 again: out
	e := f.Bound(Bound{Bounded: true, Decided: true, Limit: 60}, far)
	require.Nil(t, e.Read, "the read out is answered first")
	e = f.Page(page(&Read{ID: 2}), Env{Published: 70, ReadAhead: 1 << 20})
	require.Equal(t, &Read{ID: 3, From: 50, Target: 60, Limit: 10, MaxBytes: 1 << 20}, e.Read, "through the cut, not the publisher's 70")
	e = f.Page(page(&Read{ID: 3}, evs(55)...), Env{Published: 70, ReadAhead: 1 << 20})
	require.Nil(t, e.Read)
	require.Equal(t, Live, f.Phase())
	require.Equal(t, int64(60), f.Cursor())

	// Past the cut, a gap, a pause or a subscription read nothing.
	for _, e := range []Effects{
		f.Live(Batch{From: 65, To: 70, Events: evs(70)}, far), f.Paused(far), f.Subscribed(80, far),
	} {
		require.Nil(t, e.Read, "%s", f)
	}
	require.Equal(t, Live, f.Phase())
	require.Equal(t, int64(60), f.Cursor(), "the gap's events are not queued")

	e = f.Bound(Bound{}, Env{Published: 90, ReadAhead: 1 << 20})
	require.Equal(t, &Read{ID: 4, From: 60, Target: 90, Limit: 10, MaxBytes: 1 << 20}, e.Read, "lifted: read on from the cursor")
}

// The pending bytes follow what the window takes and puts back; the live
// queue is held while a batch's worth is pending.
func TestThePendingListHoldsTheQueueWhenFull(t *testing.T) {
	t.Parallel()
	f := New(Config{BatchSize: 3})
	f.Loaded(0, env)
	e := f.Page(page(&Read{ID: 1}, evs(1, 2, 3)...), env)
	require.Nil(t, e.Read, "full: the next page waits for room")
	require.True(t, f.Held())
	require.Equal(t, SizeOf(evs(1, 2, 3)), f.PendingBytes())
	taken := f.Take(2)
	require.Equal(t, SizeOf(evs(3)), f.PendingBytes())
	e = f.Poll(env)
	require.NotNil(t, e.Read, "room again: the catch-up reads on")
	f.PutBack(taken[1:])
	require.Equal(t, SizeOf(evs(2, 3)), f.PendingBytes())
	require.Equal(t, int64(2), f.Pending()[0].Position)
	e = f.Page(page(e.Read, evs(4)...), env)
	require.Equal(t, Live, f.Phase())
	require.True(t, f.Held(), "live, but a batch's worth is pending")
	f.Take(3)
	require.Equal(t, Effects{Release: true}, f.Poll(env))
	require.Zero(t, f.PendingBytes())
}

// A read capped at a decided cut answers for the cut only: the bound
// lifted while it was out, the catch-up reads on through what the
// publisher had posted (batches a pause dropped may hold those events).
// The simulation found this in the cap's first version (seed 1488).
func TestAReadCappedAtACutLiftedMeanwhileReadsOn(t *testing.T) {
	t.Parallel()
	f := New(Config{BatchSize: 10})
	at20 := Env{Published: 20, ReadAhead: 1 << 20}
	f.Loaded(5, at20)
	f.Bound(Bound{Bounded: true, Decided: true, Limit: 10}, at20)
	e := f.ReadAgain(at20) // the first read failed
	require.Equal(t, int64(10), e.Read.Target, "capped at the cut")
	f.Bound(Bound{}, at20)
	e = f.Page(page(e.Read, evs(7)...), at20)
	require.Equal(t, CatchingUp, f.Phase())
	require.Equal(t, &Read{ID: 3, From: 10, Target: 20, Limit: 10, MaxBytes: 1 << 20}, e.Read)
}
