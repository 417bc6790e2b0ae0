package actors

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/internal/resizepart"
	"github.com/kumi-run/kumi/leasestore"
)

// A reader its supervisor restarts during a resize starts from what its
// coordinator last told it — here the decided cut — not from what it was
// spawned with (no resize): the coordinator tells a change once, so a
// reader spawned before the resize and restarted after it was told the
// cut went on unbounded, never drained, and the resize never completed.
// One worker, 4 → 5 (every new bucket waits for every old one); the
// reader of acct-3's bucket is held back by its handler, told the cut,
// and restarted; then let go.
func TestRestartedReaderKeepsTheCut(t *testing.T) {
	t.Parallel()
	h := holdOneBucketAtTheCut(t, "restart")
	store, rec, g, w, r, held := h.store, h.rec, h.g, h.w, h.r, h.held

	// The coordinator tells the held-back reader the cut.
	told := func() (resizeTold, *actor.PID) {
		got := make(chan resizeTold, 1)
		pid := make(chan *actor.PID, 1)
		w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(c *coordinator) {
			if ref := c.readers[held]; ref != nil {
				got <- *ref.resize.Load()
				pid <- ref.pid
				return
			}
			got <- resizeTold{}
			pid <- nil
		}))
		return <-got, <-pid
	}
	var pid *actor.PID
	pgtest.Eventually(t, waitLong, func() bool {
		var m resizeTold
		m, pid = told()
		return pid != nil && m.told.Decided && m.told.Limit == r.Cut
	}, "the held-back reader is told the cut %d", r.Cut)

	// It fails (an error supervision restarts it for), and restarts.
	incarnation := func() *reader {
		got := make(chan *reader, 1)
		w.sys.Root.Send(pid, inspectReader(func(r *reader) { got <- r }))
		select {
		case r := <-got:
			return r
		case <-time.After(waitLong):
			return nil
		}
	}
	first := incarnation()
	require.NotNil(t, first)
	w.sys.Root.Send(pid, inspectReader(func(*reader) { panic(errors.New("test: the reader fails")) }))
	var next *reader
	pgtest.Eventually(t, waitLong, func() bool {
		next = incarnation()
		return next != nil && next != first
	}, "the reader restarted")

	close(g.open)
	waitResize(t, store, "restart", rec, func(r leasestore.Resize) bool {
		return r.State == leasestore.ResizeSteady && r.Generation == 1
	}, []*testWorker{w}, "the resize completes: the restarted reader drains to the cut")
	waitDelivered(t, store, "restart", "acct", rec, 80, []int{4, 5}, w)
}

// heldAtTheCut is a resize 4 → 5 of one worker with the bucket of
// acct-3 held back by its handler (g): the cut decided (r), the three
// other old buckets drained, the held-back one's slot held.
type heldAtTheCut struct {
	store *eventsource.Store
	rec   *recorder
	g     *gate
	w     *testWorker
	r     leasestore.Resize
	held  int
}

// holdOneBucketAtTheCut starts sub (8 streams, 80 events, 4 buckets) on
// one worker whose handler holds acct-3's events back, resizes it to 5,
// and waits for the cut decided and every old bucket but the held-back
// one drained.
func holdOneBucketAtTheCut(t *testing.T, sub string) heldAtTheCut {
	t.Helper()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	seed(t, store, "acct", 8, 80)
	g := &gate{stream: "acct-3", in: make(chan struct{}), open: make(chan struct{})}
	opts := groupOpts(sub, 4, rec, "w")
	opts.Lease = resizeLease()
	opts.HandlerTimeout = waitLong
	opts.Handler = g.handler(rec, "w")
	w := startWorker(t, schema, "w", opts)
	<-g.in // one bucket is held back

	_, err := Resize(ctx, store, sub, 5, ResizeOptions{By: "test"})
	require.NoError(t, err)
	var r leasestore.Resize
	held := -1
	pgtest.Eventually(t, waitLong, func() bool {
		r, err = leasestore.ReadResize(ctx, store.Pool(), schema, sub)
		require.NoError(t, err)
		held = -1
		for _, s := range r.Old {
			if !s.Drained {
				held = s.Slot
			}
		}
		return r.State == leasestore.ResizeCut && len(r.Old) == 4 && held >= 0 && countDrained(r.Old) == 3
	}, "the cut decided, three old buckets drained, the held-back one not: %+v", observed(func() leasestore.Resize { return r }))
	return heldAtTheCut{store: store, rec: rec, g: g, w: w, r: r, held: held}
}

func countDrained(ss []leasestore.SlotStatus) int {
	n := 0
	for _, s := range ss {
		if s.Drained {
			n++
		}
	}
	return n
}

// A proposal answered with no bound — the resize was cancelled after the
// coordinator's pass read it sealing and before the proposal committed —
// ends the freeze, and the reader delivers what the freeze held back.
// onProposed ended the freeze and took the answer, but setBound, finding
// no bound to lift, returned without a pump: the events that came while
// the proposal was out waited for a later batch, for ever in a quiet
// bucket.
func TestReaderDeliversWhatItsFreezeHeldBackWhenTheResizeIsGone(t *testing.T) {
	t.Parallel()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 3)
	rec := newRecorder()
	opts := groupOpts("unfreeze", 1, rec, "w")
	opts.Lease = leasestore.LeaseOptions{TTL: 30 * time.Second, Heartbeat: time.Second, Margin: 10 * time.Second}
	w := startWorker(t, schema, "w", opts)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 3 }, "the first events are delivered")

	// The proposal waits for the subscription's row, held here.
	release := holdInTransaction(t, "SELECT 1 FROM "+pgx.Identifier{schema, "subscriptions"}.Sanitize()+
		" WHERE subscription = $1 FOR UPDATE", "unfreeze")

	// What the coordinator tells a reader whose pass read the resize
	// sealing: propose. The resize is gone (here: never was) by the time
	// the proposal runs, which answers with no bound.
	pid := w.readerOf(t, 0)
	var epoch int64
	w.onReader(t, pid, func(r *reader) { epoch = r.epoch })
	w.sys.Root.Send(pid, &resizeTold{epoch: epoch, told: resizepart.Told{Resize: 1, Active: true}})
	w.onReader(t, pid, func(r *reader) {
		require.Equal(t, resizepart.Proposing, r.part.Phase(), "the reader is frozen, its proposal out: %s", r.describe())
	})
	seed(t, store, "acct", 1, 3) // appended while the proposal is out: held back
	var pending int
	pgtest.Eventually(t, waitLong, func() bool {
		w.onReader(t, pid, func(r *reader) { pending = len(r.feed.Pending()) })
		return pending == 3
	}, "the reader holds back the events appended during its freeze (%d of 3)", observed(func() int { return pending }))

	release()
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 6 },
		"the events the freeze held back are delivered once the proposal is answered (%d of 6 delivered; reader: %s)",
		observed(rec.distinct), observed(func() string {
			got := make(chan string, 1)
			w.sys.Root.Send(pid, inspectReader(func(r *reader) { got <- r.describe() }))
			select {
			case s := <-got:
				return s
			case <-time.After(5 * time.Second):
				return "no answer in 5 s"
			}
		}))
}

// holdInTransaction runs sql in a transaction it keeps open, so that what
// sql locks stays locked, and returns the function that rolls it back;
// the test's cleanup rolls it back too, if the test has not.
func holdInTransaction(t *testing.T, sql string, args ...any) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	done := false
	release = func() {
		if !done {
			done = true
			require.NoError(t, tx.Rollback(ctx))
		}
	}
	t.Cleanup(release)
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(t, err)
	return release
}

// A reader that starts at a checkpoint at the decided cut drains to it
// even when no event is to come: its catch-up has nothing to read (the
// cursor is at the cut), so no page answers and no live batch arrives,
// and the reader took its loaded checkpoint without a pump — the drain
// check ran only after a page or a batch. Its bucket was never drained,
// the resize stayed switched, and the new buckets it feeds never served
// (the demo, session leases with -exactly-once, under load: a handoff's
// drain had flushed the checkpoint at the cut; 4 and 17 events never
// handled). Here one worker, 4 → 5: the reader of acct-3's bucket is held
// back by its handler; its checkpoint is written at the cut, as a
// predecessor that handled everything up to it leaves it; the reader is
// restarted, and nothing more is appended.
func TestAReaderStartedAtTheCutDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := holdOneBucketAtTheCut(t, "atcut")
	store, rec, g, w, r, held := h.store, h.rec, h.g, h.w, h.r, h.held

	// Everything of the held-back bucket up to the cut counts as handled.
	_, err := store.SaveCheckpoint(ctx, "atcut", held, r.Cut, nil)
	require.NoError(t, err)

	var pid *actor.PID
	pgtest.Eventually(t, waitLong, func() bool {
		got := make(chan *actor.PID, 1)
		w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(c *coordinator) {
			if ref := c.readers[held]; ref != nil {
				got <- ref.pid
				return
			}
			got <- nil
		}))
		pid = <-got
		return pid != nil
	}, "the held-back bucket's reader runs")
	// It fails, and its next incarnation loads the checkpoint at the cut;
	// the held-back handler's answer is its predecessor's.
	w.sys.Root.Send(pid, inspectReader(func(*reader) { panic(errors.New("test: the reader fails")) }))
	close(g.open)
	waitResize(t, store, "atcut", rec, func(r leasestore.Resize) bool {
		return r.State == leasestore.ResizeSteady && r.Generation == 1
	}, []*testWorker{w}, "the resize completes: the reader started at the cut drains to it")
}
