package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/supervision"
)

// Under live load a slow reader's queue overflows; whatever the policy
// drops, the reader sees the gap and re-reads it: nothing is lost for the
// group, nothing is delivered twice, per-stream order holds.
func TestLiveOverflowLosesNothingUnderEveryPolicy(t *testing.T) {
	t.Parallel()
	for _, policy := range []overflow.Policy{overflow.PauseAndResume, overflow.DropSubscription, overflow.DropOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			store, schema := newTestStore(t)
			rec := newRecorder()
			// The first delivery waits until every event is appended, so
			// the queue overflows however slowly the appends go on a
			// loaded machine (the test's precondition, asserted below).
			appended := make(chan struct{})
			var holdFirst sync.Once
			slow := actor.PropsFromFunc(func(ctx actor.Context) {
				if d, ok := ctx.Message().(*Delivery); ok {
					holdFirst.Do(func() {
						select {
						case <-appended:
						case <-time.After(waitLong):
						}
					})
					rec.begin("w", d.Event)
					time.Sleep(5 * time.Millisecond) // a slow handler, the point of the test
					rec.end("w", d.Event)
					ctx.Respond(Ack{})
				}
			})
			o := groupOpts("overflow", 2, nil, "w")
			o.Handler, o.QueueCapacity, o.Overflow, o.BatchSize = slow, 1, policy, 2
			w := startWorker(t, schema, "w", o)
			pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 2 }, "owns both buckets")
			const n = 400
			// A steady trickle, faster than the handler: many small batches.
			tick := time.NewTicker(time.Millisecond)
			for i := 0; i < n; i++ {
				<-tick.C
				_, err := store.Append(context.Background(), fmt.Sprintf("acct-%d", i%9), eventsource.Any,
					[]eventsource.EventData{{Type: "Live", Data: []byte(`{}`)}})
				require.NoError(t, err)
			}
			tick.Stop()
			close(appended)
			if !pgtest.WaitFor(waitLong, func() bool { return rec.distinct() == n }) {
				t.Fatalf("%d of %d handled within %v", rec.distinct(), n, waitLong)
			}
			require.Zero(t, rec.duplicates())
			require.Empty(t, rec.order)
			dropped := w.group.g.dropped.Load()
			w.group.g.mu.Lock()
			for _, q := range w.group.g.queues {
				dropped += int64(q.Stats().Evicted)
			}
			w.group.g.mu.Unlock()
			require.Positive(t, dropped, "the queue overflowed: the test exercised the policy")
			t.Logf("%s: %d pauses, overflows and evictions, their batches re-read", policy, dropped)
		})
	}
}

// The batches a pause drops are the last of a burst: no later batch comes
// to reveal the gap, so the reader must re-read on its own. Nothing may
// wait for a later append.
func TestAPauseDroppingTheTailOfABurstLosesNothingWithoutALaterAppend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	handler, first, gate := firstHeldHandler(rec, "w")
	o := groupOpts("tail", 1, nil, "w")
	o.Handler, o.QueueCapacity, o.BatchSize = handler, 1, 2
	w := startWorker(t, schema, "w", o)
	pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 1 }, "owns the bucket")
	queue := func() overflow.Stats { return w.queueStats(0) }
	appendOne := func(i int) { w.appendPosted(t, store, fmt.Sprintf("acct-%d", i), "Burst") }
	_, err := store.Append(ctx, "acct-0", eventsource.Any, []eventsource.EventData{{Type: "Burst", Data: []byte(`{}`)}})
	require.NoError(t, err)
	<-first
	for i := 1; i < 5; i++ {
		appendOne(i) // 1, 2: pending; 3: queued; 4: the queue pauses and drops 3 and 4
	}
	require.Positive(t, queue().Pauses, "the queue paused: the test exercised the tail")
	close(gate)
	pgtest.Eventually(t, 15*time.Second, func() bool { return rec.distinct() == 5 }, "all 5 handled with no later append")
	require.Zero(t, rec.duplicates())
}

// Under DropSubscription the overflowed queue never takes a batch again.
// A reader restarted during its overflow drain (here: its checkpoint write
// fails) must not go on with that queue: it would catch up once and
// then never see another live batch. Its bucket must keep delivering.
func TestAReaderRestartedDuringItsOverflowDrainKeepsDelivering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	handler, first, gate := firstHeldHandler(rec, "w")
	o := groupOpts("dropdrain", 1, nil, "w")
	o.Handler, o.QueueCapacity, o.BatchSize, o.Overflow = handler, 1, 2, overflow.DropSubscription
	var restarts, dropped atomic.Int32
	w := &testWorker{name: "w", sys: quietSystem(), pool: pgtest.NewPool(t, 12)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond,
		Supervision: supervision.ObserverFunc(func(d supervision.Decision) {
			if d.Directive == actor.RestartDirective && strings.Contains(fmt.Sprint(d.Reason), "injected") {
				restarts.Add(1)
			}
			var oe *OverflowError
			if d.Directive == actor.StopDirective && errors.Is(d.Reason, ErrOverflowed) && errors.As(d.Reason, &oe) {
				dropped.Add(1) // the application learns of the dropped subscription
			}
		})})
	require.NoError(t, err)
	o.Worker = "w"
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 1 }, "owns the bucket")
	queue := func() overflow.Stats { return w.queueStats(0) }
	appendOne := func(i int) { w.appendPosted(t, store, fmt.Sprintf("acct-%d", i), "Burst") }
	_, err = store.Append(ctx, "acct-0", eventsource.Any, []eventsource.EventData{{Type: "Burst", Data: []byte(`{}`)}})
	require.NoError(t, err)
	<-first
	for i := 1; i < 5; i++ {
		appendOne(i) // the queue overflows: the reader drains to end its subscription
	}
	require.Equal(t, overflow.Overflowed, queue().State)

	// The drain's checkpoint write fails (a trigger raises an error that
	// is not transient): the reader fails, and supervision restarts it.
	q := pgx.Identifier{schema}.Sanitize()
	_, err = store.Pool().Exec(ctx, `CREATE FUNCTION `+q+`.fail_checkpoint() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'injected checkpoint failure'; END $$;
		CREATE TRIGGER fail_checkpoint BEFORE INSERT OR UPDATE ON `+q+`.checkpoints
		FOR EACH ROW EXECUTE FUNCTION `+q+`.fail_checkpoint()`)
	require.NoError(t, err)
	close(gate)
	pgtest.Eventually(t, waitLong, func() bool { return restarts.Load() > 0 }, "the reader is restarted during its drain")
	_, err = store.Pool().Exec(ctx, `DROP TRIGGER fail_checkpoint ON `+q+`.checkpoints`)
	require.NoError(t, err)

	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 5 }, "the burst handled")
	for i := 5; i < 10; i++ {
		_, err := store.Append(ctx, fmt.Sprintf("acct-%d", i), eventsource.Any, []eventsource.EventData{{Type: "After", Data: []byte(`{}`)}})
		require.NoError(t, err)
	}
	pgtest.Eventually(t, 15*time.Second, func() bool { return rec.distinct() == 10 }, "the events appended after the restart handled")
	require.Positive(t, dropped.Load(), "the supervision observer saw the reader end with the OverflowError")
}

// queueStats is the stats of the queue of slot's reader, zero while it has
// none.
func (w *testWorker) queueStats(slot int) overflow.Stats {
	w.group.g.mu.Lock()
	defer w.group.g.mu.Unlock()
	if q := w.group.g.queues[slot]; q != nil {
		return q.Stats()
	}
	return overflow.Stats{}
}

// appendPosted appends one event of type typ to stream, and waits until
// the publisher has posted it to the queue of slot 0's reader.
func (w *testWorker) appendPosted(t *testing.T, store *eventsource.Store, stream, typ string) {
	t.Helper()
	posted := w.queueStats(0).Posted
	_, err := store.Append(context.Background(), stream, eventsource.Any, []eventsource.EventData{{Type: typ, Data: []byte(`{}`)}})
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return w.queueStats(0).Posted > posted }, "%s's event posted as a batch of its own", stream)
}

// firstHeldHandler acks every delivery, recorded in rec as worker's, but
// holds the first until gate is closed (first is closed as it arrives):
// the handler is busy while live batches fill the reader's queue.
func firstHeldHandler(rec *recorder, worker string) (handler *actor.Props, first, gate chan struct{}) {
	first, gate = make(chan struct{}), make(chan struct{})
	var once sync.Once
	handler = actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			once.Do(func() {
				close(first)
				<-gate
			})
			rec.begin(worker, d.Event)
			rec.end(worker, d.Event)
			ctx.Respond(Ack{})
		}
	})
	return handler, first, gate
}
