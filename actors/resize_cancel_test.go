package actors

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// heldPasses is a pgx tracer that, while armed, holds every lease pass
// (not the sequencer's steps) back at its first round trip until the pass's context ends (the pass is
// then abandoned, as a starved one is): no pass of the worker reads or
// writes the leases while it is armed. held counts the passes held. With
// locks armed, it holds back the subscription's lock of every resize
// transition the worker starts (a proposal, a drain) until release is
// closed; lockHeld counts them.
type heldPasses struct {
	armed    atomic.Bool
	held     atomic.Int64
	locks    atomic.Bool
	lockHeld atomic.Int64
	release  chan struct{}
}

func (h *heldPasses) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if h.armed.Load() && opensLeasePass(data.Batch.QueuedQueries) {
		h.held.Add(1)
		<-ctx.Done()
	}
	return ctx
}

// opensLeasePass is opensPass for a lease pass only: the sequencer's step
// bounds its transaction the same way, and holding it back would hold back
// the positions of what is appended meanwhile.
func opensLeasePass(q []*pgx.QueuedQuery) bool {
	if !opensPass(q) {
		return false
	}
	for _, qq := range q[:2] {
		if strings.Contains(qq.SQL, "kumi.protocol") {
			return true
		}
	}
	return false
}

func (*heldPasses) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*heldPasses) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (h *heldPasses) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if h.locks.Load() && strings.Contains(data.SQL, ".subscriptions WHERE subscription = $1") &&
		strings.HasSuffix(strings.TrimRight(data.SQL, "; \n"), "FOR UPDATE") {
		h.lockHeld.Add(1)
		select {
		case <-h.release:
		case <-ctx.Done():
		}
	}
	return ctx
}
func (*heldPasses) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// startHeldWorker is startWorker on a pool traced by hold.
func startHeldWorker(t *testing.T, schema, name string, opts GroupOptions, hold *heldPasses) *testWorker {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns, cfg.ConnConfig.Tracer = 12, hold
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	w := startWorkerOn(t, pool, schema, name, opts)
	t.Cleanup(func() { // before the worker's stop
		hold.armed.Store(false)
		hold.locks.Store(false)
	})
	return w
}

// streamInAnotherBucket is a stream acct-k, k below streams, whose bucket
// of n differs from that of stream acct-<not>.
func streamInAnotherBucket(t *testing.T, n, streams, not int) string {
	t.Helper()
	b := eventsource.BucketOfHash(eventsource.Hash(strconv.Itoa(not)), n)
	for k := range streams {
		if eventsource.BucketOfHash(eventsource.Hash(strconv.Itoa(k)), n) != b {
			return fmt.Sprintf("acct-%d", k)
		}
	}
	t.Fatalf("every stream of %d is in bucket %d of %d", streams, b, n)
	return ""
}

// A bucket drained to the cut and taken again after a cancel, before the
// worker's next pass, is served again: one worker, 4 → 5 (every new bucket
// waits for every old one), two buckets held back by their handler; the
// cut is decided and the other two drain; the worker's passes are held
// back; one held-back bucket is let go and drains; the resize is
// cancelled; the next pass — the first since the drain — claims the
// bucket again, at a new epoch. The coordinator, which ignores a pass's
// report of a slot it saw drain (a pass that began before the drain
// reports it held), took that claim for such a report, for every pass
// after: the lease renewed for ever, no reader, its events never
// delivered. It now knows the drained slot by its epoch.
func TestADrainedBucketTakenAgainAfterACancelIsServed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	seed(t, store, "acct", 8, 80)
	a := &gate{stream: "acct-3", in: make(chan struct{}), open: make(chan struct{})}
	b := &gate{stream: streamInAnotherBucket(t, 4, 8, 3), in: make(chan struct{}), open: make(chan struct{})}
	opts := groupOpts("retaken", 4, rec, "w")
	opts.Lease = resizeLease()
	opts.HandlerTimeout = waitLong
	opts.Handler = actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			rec.begin("w", d.Event)
			a.wait(d)
			b.wait(d)
			rec.end("w", d.Event)
			ctx.Respond(Ack{})
		}
	})
	hold := &heldPasses{}
	w := startHeldWorker(t, schema, "w", opts, hold)
	<-a.in
	<-b.in

	_, err := Resize(ctx, store, "retaken", 5, ResizeOptions{By: "test"})
	require.NoError(t, err)
	drained := func(want int) func(leasestore.Resize) bool {
		return func(r leasestore.Resize) bool { return r.State == leasestore.ResizeCut && countDrained(r.Old) == want }
	}
	ws := []*testWorker{w}
	waitResize(t, store, "retaken", rec, drained(2), ws, "the cut decided, the two buckets not held back drained")

	hold.armed.Store(true)
	pgtest.Eventually(t, waitLong, func() bool { return hold.held.Load() > 0 }, "a pass held back")
	close(b.open)
	waitResize(t, store, "retaken", rec, drained(3), ws, "the bucket let go drained")
	_, err = CancelResize(ctx, store, "retaken")
	require.NoError(t, err)
	hold.armed.Store(false)

	close(a.open)
	seed(t, store, "acct", 8, 16)
	waitDelivered(t, store, "retaken", "acct", rec, 96, []int{4, 5}, w)
	require.Zero(t, rec.duplicates(), "a cancel repeats nothing")
}

// passRead waits until the worker's coordinator has acted on a pass that
// read the resize id in state, or in a later one: a resize free to go on
// may pass through a state between two of the wait's looks (a loaded CI
// machine saw B at its cut before a look saw it sealing).
func passRead(t *testing.T, w *testWorker, id int64, state leasestore.ResizeState) {
	t.Helper()
	order := map[leasestore.ResizeState]int{leasestore.ResizeSealing: 1, leasestore.ResizeCut: 2,
		leasestore.ResizeSwitched: 3, leasestore.ResizeSteady: 4} // steady: this resize ended
	var r leasestore.Resize
	pgtest.Eventually(t, waitLong, func() bool {
		w.group.g.mu.Lock()
		r = w.group.g.resize
		w.group.g.mu.Unlock()
		return r.ID == id && order[r.State] >= order[state]
	}, "a pass read resize %d %s or later (read %+v)", id, state, observed(func() leasestore.Resize { return r }))
}

// A cancel followed at once by a new resize, with a slow bucket bounded by
// the cancelled resize's cut: the bucket takes the new resize's seal and
// proposes, and the new resize completes. One worker, 2 → 3 (a barrier),
// the bucket of acct-3 held back by its handler: the cut of resize A is
// decided, the other bucket drains; the worker's passes are held back, A
// is cancelled and B requested, so that the next pass reads B sealing
// straight after A's cut. The bucket's reader, bounded by A's cut, took B's
// seal for news it had (it proposed only with no bound), then its drain to
// A's cut was refused and it went on unbounded, never proposing: B stayed
// sealing for good, and the new resize never finished.
func TestACancelFollowedAtOnceByANewResizeCompletes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	seed(t, store, "acct", 8, 40)
	g := &gate{stream: "acct-3", in: make(chan struct{}), open: make(chan struct{})}
	opts := groupOpts("again", 2, rec, "w")
	opts.Lease = resizeLease()
	opts.HandlerTimeout = waitLong
	opts.Handler = g.handler(rec, "w")
	hold := &heldPasses{}
	w := startHeldWorker(t, schema, "w", opts, hold)
	<-g.in

	a, err := Resize(ctx, store, "again", 3, ResizeOptions{By: "test"})
	require.NoError(t, err)
	waitResize(t, store, "again", rec, func(r leasestore.Resize) bool {
		return r.State == leasestore.ResizeCut && countDrained(r.Old) == 1
	}, []*testWorker{w}, "A's cut decided, the bucket not held back drained")
	passRead(t, w, a.ID, leasestore.ResizeCut)

	hold.armed.Store(true)
	pgtest.Eventually(t, waitLong, func() bool { return hold.held.Load() > 0 }, "a pass held back")
	_, err = CancelResize(ctx, store, "again")
	require.NoError(t, err)
	b, err := Resize(ctx, store, "again", 3, ResizeOptions{By: "test"})
	require.NoError(t, err)
	hold.armed.Store(false)
	passRead(t, w, b.ID, leasestore.ResizeSealing)

	close(g.open)
	seed(t, store, "acct", 8, 16)
	waitResize(t, store, "again", rec, func(r leasestore.Resize) bool {
		return r.State == leasestore.ResizeSteady && r.Generation == 1
	}, []*testWorker{w}, "B completes")
	waitDelivered(t, store, "again", "acct", rec, 56, []int{2, 3}, w)
}

// A proposal that outlives a cancel is not counted for the next resize,
// and the reader stays bounded by the next resize's cut. One worker, one
// bucket, 1 → 2: the reader's proposal for resize A is held back; A is
// cancelled, the worker's pass tells the reader so, B is requested and a
// pass tells it that too; events appended meanwhile wait behind the
// freeze; then the proposal runs, the worker's passes held back. It
// proposed for B — whichever resize was in force — and, the bucket being
// the only one, decided B's cut; the reader took the answer, then the
// older cancel, and delivered the events appended next, beyond B's cut,
// in the old generation; its drain was refused for ever (its checkpoint
// beyond the cut) and B never completed. Now the proposal names A, is
// refused, and the reader proposes for B.
func TestAProposalThatOutlivesACancelIsNotTheNextResizes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	ds := &deliveries{by: map[uuid.UUID][]delivered{}}
	seed(t, store, "acct", 4, 10)
	opts := groupOpts("late", 1, rec, "w")
	opts.Lease = resizeLease()
	opts.Handler = actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			ds.add("w", d)
			rec.begin("w", d.Event)
			rec.end("w", d.Event)
			ctx.Respond(Ack{})
		}
	})
	hold := &heldPasses{release: make(chan struct{})}
	w := startHeldWorker(t, schema, "w", opts, hold)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 10 }, "the first events delivered")

	hold.locks.Store(true)
	a, err := Resize(ctx, store, "late", 2, ResizeOptions{By: "test"})
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return hold.lockHeld.Load() > 0 }, "the proposal for A held back")
	_, err = CancelResize(ctx, store, "late")
	require.NoError(t, err)
	passRead(t, w, a.ID, leasestore.ResizeSteady)
	b, err := Resize(ctx, store, "late", 2, ResizeOptions{By: "test"})
	require.NoError(t, err)
	passRead(t, w, b.ID, leasestore.ResizeSealing)
	// Appended during the freeze: held back, and below B's cut.
	seed(t, store, "acct", 4, 4)
	pid := w.readerOf(t, 0)
	var pending int
	pgtest.Eventually(t, waitLong, func() bool {
		w.onReader(t, pid, func(r *reader) { pending = len(r.feed.Pending()) })
		return pending == 4
	}, "the frozen reader holds back what was appended (%d of 4)", observed(func() int { return pending }))

	// The proposal runs, while the worker's passes are held back: what
	// the reader does with its answer is up to it alone.
	hold.armed.Store(true)
	pgtest.Eventually(t, waitLong, func() bool { return hold.held.Load() > 0 }, "a pass held back")
	hold.locks.Store(false)
	close(hold.release)
	cut := int64(-1)
	done := func() bool {
		r, err := leasestore.ReadResize(ctx, store.Pool(), schema, "late")
		require.NoError(t, err)
		if r.ID == b.ID && r.CutDecided {
			cut = r.Cut
		}
		return r.State == leasestore.ResizeSteady && r.Generation == 1
	}
	pgtest.Eventually(t, waitLong, func() bool { return done() || cut >= 0 }, "B's cut decided")
	seed(t, store, "acct", 4, 4) // beyond the cut
	pgtest.Eventually(t, waitLong, func() bool { return done() || ds.lastOf(0) > cut },
		"the old bucket drains, or delivers beyond the cut %d", cut)
	hold.armed.Store(false)

	waitResize(t, store, "late", rec, func(leasestore.Resize) bool { return done() }, []*testWorker{w}, "B completes")
	waitDelivered(t, store, "late", "acct", rec, 18, []int{1, 2}, w)
	bad, _ := ds.badDuplicates()
	require.Empty(t, bad, "no event delivered by both generations")
}

// lastOf is the last position generation gen delivered.
func (ds *deliveries) lastOf(gen int) int64 {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	last := int64(0)
	for _, l := range ds.by {
		for _, d := range l {
			if d.generation == gen {
				last = max(last, d.position)
			}
		}
	}
	return last
}
