package actors

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// heldPasses is a pgx tracer that, while armed, holds every lease pass
// back at its first round trip until the pass's context ends (the pass is
// then abandoned, as a starved one is): no pass of the worker reads or
// writes the leases while it is armed. held counts the passes held.
type heldPasses struct {
	armed atomic.Bool
	held  atomic.Int64
}

func (h *heldPasses) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if h.armed.Load() && opensPass(data.Batch.QueuedQueries) {
		h.held.Add(1)
		<-ctx.Done()
	}
	return ctx
}

func (*heldPasses) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*heldPasses) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (*heldPasses) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*heldPasses) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

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
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns, cfg.ConnConfig.Tracer = 12, hold
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	w := startWorkerOn(t, pool, schema, "w", opts)
	t.Cleanup(func() { hold.armed.Store(false) }) // before the worker's stop
	<-a.in
	<-b.in

	_, err = Resize(ctx, store, "retaken", 5, ResizeOptions{By: "test"})
	require.NoError(t, err)
	drained := func(want int) func() bool {
		return func() bool {
			r, err := leasestore.ReadResize(ctx, store.Pool(), schema, "retaken")
			require.NoError(t, err)
			return r.State == leasestore.ResizeCut && countDrained(r.Old) == want
		}
	}
	pgtest.Eventually(t, waitLong, drained(2), "the cut decided, the two buckets not held back drained")

	hold.armed.Store(true)
	pgtest.Eventually(t, waitLong, func() bool { return hold.held.Load() > 0 }, "a pass held back")
	close(b.open)
	pgtest.Eventually(t, waitLong, drained(3), "the bucket let go drained")
	_, err = CancelResize(ctx, store, "retaken")
	require.NoError(t, err)
	hold.armed.Store(false)

	close(a.open)
	seed(t, store, "acct", 8, 16)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 96 }, "every event delivered: %s",
		observed(func() string {
			return fmt.Sprintf("%d of 96 delivered; owned %v; readers %v", rec.distinct(), w.owned(), readersOf(w))
		}))
	require.Zero(t, rec.duplicates(), "a cancel repeats nothing")
}

// readersOf lists the slots the worker's coordinator has a reader for.
func readersOf(w *testWorker) []int {
	got := make(chan []int, 1)
	w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(c *coordinator) {
		var out []int
		for s := range c.readers {
			out = append(out, s)
		}
		got <- out
	}))
	return <-got
}
