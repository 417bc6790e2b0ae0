package kumitest_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/kumitest"
)

// ledger is a handler's effects: balances by account.
type ledger struct {
	mu       sync.Mutex
	balances map[string]int
	applied  map[string]int64 // the next version to apply, by stream (the idempotent handler's)
}

func newLedger() *ledger { return &ledger{balances: map[string]int{}, applied: map[string]int64{}} }

func (l *ledger) effects() any {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.balances)
}

// naive adds every deposit it is given: not idempotent.
func (l *ledger) naive(_ context.Context, d *actors.Delivery, e deposited) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.balances[d.Event.Stream] += e.Amount
	return nil
}

// idempotent applies each version of a stream once: a repeat (version 6
// again after 7) is skipped.
func (l *ledger) idempotent(_ context.Context, d *actors.Delivery, e deposited) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d.Event.Version < l.applied[d.Event.Stream] {
		return nil
	}
	l.balances[d.Event.Stream] += e.Amount
	l.applied[d.Event.Stream] = d.Event.Version + 1
	return nil
}

// key is a delivery without its handler-independent detail.
type key struct {
	stream                      string
	version                     int64
	attempt, generation, bucket int
	epoch                       int64
	fault                       kumitest.Fault
}

func keys(res *kumitest.Result) []key {
	out := make([]key, len(res.Deliveries))
	for i, d := range res.Deliveries {
		out[i] = key{d.Event.Stream, d.Event.Version, d.Attempt, d.Generation, d.Bucket, d.Epoch, d.Fault}
	}
	return out
}

// Each fault schedule really happens: the deliveries it makes are counted
// and checked against what it stands for.
func TestEveryFaultScheduleHappens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	events := deposits(60, 5)

	run := func(t *testing.T, g actors.GroupOptions, f kumitest.Fault, seed int64) *kumitest.Result {
		t.Helper()
		l := newLedger()
		if g.Handler == nil {
			g.Handler = actors.Typed(l.idempotent)
		}
		res, err := newKit(t, g).RunFault(ctx, f, seed, events...)
		require.NoError(t, err)
		require.Equal(t, len(events), res.Acked(), "every event acked")
		return res
	}

	t.Run("CrashTailRedeliversAnEarlierVersionAfterALaterOne", func(t *testing.T) {
		t.Parallel()
		backwards := 0
		for seed := int64(1); seed <= 8; seed++ {
			res := run(t, actors.GroupOptions{CheckpointEvery: 5}, kumitest.CrashTail, seed)
			tail := res.Of(kumitest.CrashTail)
			require.NotEmpty(t, tail, "seed %d: the tail is delivered again", seed)
			require.Greater(t, len(res.Deliveries), len(events), "seed %d: more deliveries than events", seed)
			lastSeen := map[string]int64{}
			for _, d := range res.Deliveries {
				if v, ok := lastSeen[d.Event.Stream]; ok && d.Event.Version < v {
					backwards++
				}
				lastSeen[d.Event.Stream] = d.Event.Version
			}
			// Redeliveries come from a new owner: a later epoch, a new handler.
			first := tail[0]
			require.Greater(t, first.Epoch, int64(1))
		}
		require.Positive(t, backwards, "some crash repeats version v after version v+1 or later")
	})

	t.Run("DuplicatesDeliverAnAckedEventAgainAtOnce", func(t *testing.T) {
		t.Parallel()
		res := run(t, actors.GroupOptions{}, kumitest.Duplicates, 3)
		dups := 0
		for i, d := range res.Deliveries {
			if d.Fault != kumitest.Duplicates {
				continue
			}
			dups++
			require.True(t, d.Ignored)
			prev := res.Deliveries[i-1]
			require.Equal(t, prev.Event.ID, d.Event.ID, "the duplicate follows the event's ack")
			require.Equal(t, "ack", string(prev.Outcome))
		}
		require.Positive(t, dups)
		require.Len(t, res.Deliveries, len(events)+dups)
	})

	t.Run("ATimeoutRetryRunsWhileTheFirstAttemptStillRuns", func(t *testing.T) {
		t.Parallel()
		g := actors.GroupOptions{HandlerTimeout: 10 * time.Second}
		// A seed draws the same schedule every time: a first pass finds the
		// attempts that time out, and a second makes each of them wait for
		// its retry to start.
		slow := map[int64]chan struct{}{}
		for _, d := range run(t, g, kumitest.TimeoutRetry, 1).Of(kumitest.TimeoutRetry) {
			slow[d.Event.Position] = make(chan struct{})
		}
		require.NotEmpty(t, slow)
		var overlapped atomic.Int32
		g.Handler = actors.Func(func(_ context.Context, d *actors.Delivery) error {
			ch, ok := slow[d.Event.Position]
			switch {
			case !ok:
			case d.Attempt == 0:
				select {
				case <-ch:
					overlapped.Add(1)
				case <-time.After(10 * time.Second):
				}
			case d.Attempt == 1:
				close(ch)
			}
			return nil
		})
		res := run(t, g, kumitest.TimeoutRetry, 1)
		given := res.Of(kumitest.TimeoutRetry)
		require.Len(t, given, len(slow))
		require.EqualValues(t, len(given), overlapped.Load(), "each timed-out attempt was still running when its retry started")
		for _, d := range given {
			require.Equal(t, "timeout", string(d.Outcome))
			var retry *kumitest.Delivery
			for i := range res.Deliveries {
				if r := &res.Deliveries[i]; r.Event.ID == d.Event.ID && r.Attempt == 1 {
					retry = r
				}
			}
			require.NotNil(t, retry, "the retry of %s@%d", d.Event.Stream, d.Event.Version)
			require.NotEqual(t, d.Handler, retry.Handler, "the retry goes to the hung handler's successor")
			require.GreaterOrEqual(t, retry.At-d.At, 10*time.Second, "after HandlerTimeout on the simulated clock")
		}
	})

	t.Run("AHandoffInTheMiddleOfAStreamRepeatsNothing", func(t *testing.T) {
		t.Parallel()
		res := run(t, actors.GroupOptions{}, kumitest.Handoff, 2)
		handoffs := res.Of(kumitest.Handoff)
		require.NotEmpty(t, handoffs)
		require.Len(t, res.Deliveries, len(events), "nothing delivered twice")
		for _, h := range handoffs {
			require.Positive(t, h.Event.Version, "the stream had events before")
			var before *kumitest.Delivery
			for i := range res.Deliveries {
				if d := &res.Deliveries[i]; d.Bucket == h.Bucket && d.At <= h.At && d.Event.Position < h.Event.Position {
					before = d
				}
			}
			require.NotNil(t, before)
			require.Greater(t, h.Epoch, before.Epoch, "a new owner")
			require.NotEqual(t, h.Handler, before.Handler, "a new handler")
		}
	})

	t.Run("AResizeCutMovesTheRestToTheNextGeneration", func(t *testing.T) {
		t.Parallel()
		res := run(t, actors.GroupOptions{}, kumitest.ResizeCut, 4)
		require.Len(t, res.Deliveries, len(events), "no event delivered by both generations")
		gens := map[string]map[int]bool{}
		last := map[string]int64{}
		for _, d := range res.Deliveries {
			if gens[d.Event.Stream] == nil {
				gens[d.Event.Stream] = map[int]bool{}
			}
			gens[d.Event.Stream][d.Generation] = true
			if v, ok := last[d.Event.Stream]; ok {
				require.Equal(t, v+1, d.Event.Version, "per-stream order across the cut")
			}
			last[d.Event.Stream] = d.Event.Version
		}
		spanning := 0
		for _, g := range gens {
			if len(g) == 2 {
				spanning++
			}
		}
		require.Positive(t, spanning, "a stream cut in its middle")
		require.NotEmpty(t, res.Of(kumitest.ResizeCut))
	})

	t.Run("BatchSplitCutsBatchesAtRandomSizes", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		sizes := map[int]int{}
		h := actors.BatchFunc(func(_ context.Context, b *actors.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			sizes[len(b.Events)]++
			return nil
		})
		res := run(t, actors.GroupOptions{Buckets: 1, Handler: h, Batch: actors.BatchOptions{MaxEvents: 10}}, kumitest.BatchSplit, 1)
		mu.Lock()
		defer mu.Unlock()
		require.Greater(t, len(sizes), 3, "batches of many sizes: %v", sizes)
		require.NotEmpty(t, res.Of(kumitest.BatchSplit), "batches cut short while more events waited")
		for _, d := range res.Of(kumitest.BatchSplit) {
			require.Less(t, d.Events, 10)
		}
		n := 0
		for _, d := range res.Deliveries {
			n += d.Events
		}
		require.Equal(t, len(events), n, "each event in one batch")
	})

	// With batches, each schedule acts too: a fault planned at an event
	// in the middle of a batch acts on the batch (a crash) or heads one (a
	// handoff, a timeout).
	t.Run("EveryScheduleActsOnBatches", func(t *testing.T) {
		t.Parallel()
		g := actors.GroupOptions{Buckets: 2, CheckpointEvery: 4, Batch: actors.BatchOptions{MaxEvents: 8},
			Handler: actors.BatchFunc(func(context.Context, *actors.Batch) error { return nil })}
		for _, f := range kumitest.Faults() {
			res := run(t, g, f, 5)
			require.NotEmpty(t, res.Of(f), "%s", f)
		}
	})

	t.Run("ASeedReplaysItsSchedule", func(t *testing.T) {
		t.Parallel()
		for _, f := range kumitest.Faults() {
			g := actors.GroupOptions{CheckpointEvery: 3}
			if f == kumitest.BatchSplit {
				g.Batch = actors.BatchOptions{MaxEvents: 7}
			}
			a, b := run(t, g, f, 11), run(t, g, f, 11)
			require.Equal(t, keys(a), keys(b), "%s", f)
			require.NotEqual(t, keys(a), keys(run(t, g, f, 12)), "%s: another seed, another schedule", f)
		}
	})
}

func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	events := deposits(40, 4)

	t.Run("AnIdempotentHandlerPassesEverySchedule", func(t *testing.T) {
		t.Parallel()
		k := newKit(t, actors.GroupOptions{CheckpointEvery: 5, Batch: actors.BatchOptions{}})
		err := k.Check(ctx, events, func() kumitest.World {
			l := newLedger()
			return kumitest.World{Handler: actors.Typed(l.idempotent), Effects: l.effects}
		}, kumitest.CheckOptions{})
		require.NoError(t, err)
	})

	t.Run("AnIdempotentBatchHandlerPassesEverySchedule", func(t *testing.T) {
		t.Parallel()
		k := newKit(t, actors.GroupOptions{CheckpointEvery: 5, Batch: actors.BatchOptions{MaxEvents: 6}})
		err := k.Check(ctx, events, func() kumitest.World {
			l := newLedger()
			return kumitest.World{Handler: actors.BatchFunc(func(ctx context.Context, b *actors.Batch) error {
				for _, e := range b.Events {
					d := &actors.Delivery{Event: e}
					if err := l.idempotent(ctx, d, deposited{Amount: 1}); err != nil {
						return err
					}
				}
				return nil
			}), Effects: l.effects}
		}, kumitest.CheckOptions{})
		require.NoError(t, err)
	})

	t.Run("ANonIdempotentHandlerIsCaughtWithItsScheduleAndSeed", func(t *testing.T) {
		t.Parallel()
		k := newKit(t, actors.GroupOptions{CheckpointEvery: 5})
		world := func() kumitest.World {
			l := newLedger()
			return kumitest.World{Handler: actors.Typed(l.naive), Effects: l.effects}
		}
		err := k.Check(ctx, events, world, kumitest.CheckOptions{})
		var fe *kumitest.FaultError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, kumitest.CrashTail, fe.Fault)
		require.Equal(t, int64(1), fe.Seed)
		require.Contains(t, err.Error(), `kumitest.CheckOptions{Faults: []kumitest.Fault{"crash-tail"}, Seed: 1, Seeds: 1}`)
		// Replayed by its seed, the same schedule breaks it the same way.
		again := k.Check(ctx, events, world, kumitest.CheckOptions{Faults: []kumitest.Fault{fe.Fault}, Seed: fe.Seed, Seeds: 1})
		var fe2 *kumitest.FaultError
		require.ErrorAs(t, again, &fe2)
		require.Equal(t, fe.Faulty, fe2.Faulty)
		// Each duplicating schedule catches it; those that repeat nothing do not.
		for _, f := range []kumitest.Fault{kumitest.Duplicates, kumitest.TimeoutRetry} {
			require.ErrorAs(t, k.Check(ctx, events, world, kumitest.CheckOptions{Faults: []kumitest.Fault{f}, Seeds: 1}), &fe, "%s", f)
		}
		require.NoError(t, k.Check(ctx, events, world, kumitest.CheckOptions{Faults: []kumitest.Fault{kumitest.Handoff, kumitest.ResizeCut}}))
	})

	t.Run("AHandlerKeepingStateInItsActorIsCaughtByAHandoff", func(t *testing.T) {
		t.Parallel()
		// State kept per handler actor is lost when the bucket moves: the
		// next owner's handler starts over.
		k := newKit(t, actors.GroupOptions{Buckets: 1})
		err := k.Check(ctx, events, func() kumitest.World {
			var mu sync.Mutex
			last := map[string]int{}
			return kumitest.World{
				Handler: actorCounter(&mu, last),
				Effects: func() any { mu.Lock(); defer mu.Unlock(); return maps.Clone(last) },
			}
		}, kumitest.CheckOptions{Faults: []kumitest.Fault{kumitest.Handoff}})
		var fe *kumitest.FaultError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, kumitest.Handoff, fe.Fault)
	})

	t.Run("BadOptionsAreRefused", func(t *testing.T) {
		t.Parallel()
		k := newKit(t, actors.GroupOptions{Handler: actors.Func(func(context.Context, *actors.Delivery) error { return nil })})
		err := k.Check(ctx, events, func() kumitest.World { return kumitest.World{} }, kumitest.CheckOptions{})
		require.ErrorContains(t, err, "kumitest.World.Effects")
		err = k.Check(ctx, events, nil, kumitest.CheckOptions{})
		require.Error(t, err)
		err = k.Check(ctx, events, func() kumitest.World { return kumitest.World{Effects: func() any { return nil }} },
			kumitest.CheckOptions{Faults: []kumitest.Fault{"flood"}})
		require.ErrorContains(t, err, "kumitest.CheckOptions.Faults")
		require.False(t, errors.As(err, new(*kumitest.FaultError)))
	})
}

// actorCounter is an actor handler that counts each stream's deposits in
// its own state and publishes the count: a handler whose state lives and
// dies with its actor.
func actorCounter(mu *sync.Mutex, out map[string]int) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		counts := map[string]int{}
		return actor.ReceiveFunc(func(c actor.Context) {
			if d, ok := c.Message().(*actors.Delivery); ok {
				counts[d.Event.Stream]++
				mu.Lock()
				out[d.Event.Stream] = counts[d.Event.Stream]
				mu.Unlock()
				c.Respond(actors.Ack{})
			}
		})
	})
}

// A BatchFunc given single deliveries (batching off) sees each as a batch
// of one with the delivery's generation: after a resize, its
// CommitBatchWithCheckpoint writes the new generation's checkpoint. (It
// saw generation 0, the kit's ResizeCut found.)
func TestABatchFuncGivenSingleDeliveriesSeesTheirGeneration(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[int64]int{}
	k := newKit(t, actors.GroupOptions{Handler: actors.BatchFunc(func(_ context.Context, b *actors.Batch) error {
		mu.Lock()
		defer mu.Unlock()
		seen[b.Events[0].Position] = b.Generation
		return nil
	})})
	res, err := k.RunFault(context.Background(), kumitest.ResizeCut, 1, deposits(20, 3)...)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	gen1 := 0
	for _, d := range res.Deliveries {
		require.Equal(t, d.Generation, seen[d.Event.Position], "%s@%d", d.Event.Stream, d.Event.Version)
		gen1 += d.Generation
	}
	require.Positive(t, gen1, "some events came from generation 1")
}
