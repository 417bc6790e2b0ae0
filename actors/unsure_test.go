package actors

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/checkpointing"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// A renewal that runs late makes EnsureHeld fail although the lease is
// still held; the reader stops, and the next pass respawns it. What it
// acked before it stopped must not be delivered again: it writes its
// acked position (fenced) before it stops.
func TestASurvivedRenewalFailureRedeliversNothing(t *testing.T) {
	t.Parallel()
	_, schema := newTestStore(t)
	u := startUnsureIn(t, schema, "unsure", nil, nil)
	release := u.holdRenewals(t)
	defer release()
	pgtest.Eventually(t, waitLong, func() bool { return u.w.group.g.leases.EnsureHeld(0) != nil }, "the lease becomes unsure")
	seed(t, u.store, "acct", 1, 1) // the next delivery finds it unsure
	pgtest.Eventually(t, waitLong, u.fenceLost, "the reader stops on the unsure lease")
	release() // the renewal lands: the lease was held all along

	pgtest.Eventually(t, waitLong, func() bool { return u.rec.distinct() == 51 }, "the new event handled by the respawned reader")
	require.Zero(t, u.rec.duplicates(), "nothing acked before the stop was delivered again")
}

// The unsure reader's last write can fail too (under load it times out):
// what it acked then never reaches the checkpoint. The lease was held all
// along, at the same epoch, so nobody else read the bucket meanwhile: the
// reader the coordinator spawns next at that epoch starts after
// everything its predecessor acked, not at the older checkpoint, and
// delivers nothing twice. (Before, it started at the checkpoint and
// delivered the 50 events again.)
func TestAnUnsureReaderWhoseLastWriteFailsRedeliversNothing(t *testing.T) {
	t.Parallel()
	_, schema := newTestStore(t)
	var before map[int]string
	u, release := stopUnsureUnwritten(t, schema, "unsurelast", nil, func(u *unsureRun) { before = holders(t, schema, "unsurelast") })
	defer release()
	release() // the renewal lands: the lease was held all along

	pgtest.Eventually(t, waitLong, func() bool { return u.rec.distinct() == 51 }, "the new event handled by the respawned reader (got %d)%s",
		observed(u.rec.distinct), observed(u.w.diagnose))
	require.Equal(t, before, holders(t, schema, "unsurelast"), "the bucket held at the same epoch throughout")
	require.Zero(t, u.rec.duplicates(), "nothing acked before the stop was delivered again")
}

// stopUnsureUnwritten starts an unsure run of sub (opt, if not nil,
// adjusts its options; started, if not nil, is called once the backlog is
// handled) whose checkpoint writes wait for a lock and fail after
// DatabaseTimeout (2 s), holds its renewals until the lease is unsure,
// appends an event that its next delivery finds so, and waits until the
// reader stopped, its last write failed (the lock then released): what it
// handled is in its slot's mark only. The renewals stay held until
// release (idempotent).
func stopUnsureUnwritten(t *testing.T, schema, sub string, opt func(*GroupOptions), started func(*unsureRun)) (*unsureRun, func()) {
	t.Helper()
	ctx := context.Background()
	// Every checkpoint write waits for this lock, and gives up after
	// DatabaseTimeout: none lands until the lock is released (so the
	// backlog's acks cannot reach the checkpoint by a timely flush).
	ck, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ck.Rollback(ctx) }()
	_, err = ck.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, "checkpoints"}.Sanitize()+` IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	u := startUnsureIn(t, schema, sub, func(o *GroupOptions, _ *recorder) {
		o.DatabaseTimeout = 2 * time.Second
		if opt != nil {
			opt(o)
		}
	}, nil)
	if started != nil {
		started(u)
	}
	release := u.holdRenewals(t)
	pgtest.Eventually(t, waitLong, func() bool { return u.w.group.g.leases.EnsureHeld(0) != nil }, "the lease becomes unsure")
	seed(t, u.store, "acct", 1, 1) // the next delivery finds it unsure
	// The reader drains: its last write waits for the lock and fails, and
	// it stops; the coordinator forgets the bucket until a pass says.
	pgtest.Eventually(t, waitLong, func() bool { return len(u.w.owned()) == 0 },
		"the reader stops on the unsure lease after its last write failed (owned %v)%s", observed(u.w.owned), observed(u.w.diagnose))
	require.NoError(t, ck.Rollback(ctx))
	return u, release
}

// unsureRun is a worker whose lease can become unsure while still held.
type unsureRun struct {
	w      *testWorker
	rec    *recorder
	store  *eventsource.Store
	schema string
	sub    string
	spans  *tracetest.InMemoryExporter
}

// startUnsureIn starts worker w on a one-bucket subscription whose lease
// is usable for 2 s after a renewal and valid for 6 s, and that flushes
// its checkpoint only when it must, and waits until w handled a backlog
// of 50 events. opt, if not nil, adjusts the options (given the run's
// recorder); tracer, if not nil, traces the worker's pool.
func startUnsureIn(t *testing.T, schema, sub string, opt func(*GroupOptions, *recorder), tracer pgx.QueryTracer) *unsureRun {
	t.Helper()
	ctx := context.Background()
	store, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	seed(t, store, "acct", 5, 50)
	u := &unsureRun{rec: newRecorder(), store: store, schema: schema, sub: sub}
	o := groupOpts(sub, 1, u.rec, "w")
	// Usable for 2 s after a renewal; valid for 6 s: a renewal held up for
	// a little over two seconds leaves the lease held but unsure. (A
	// heartbeat of a second: a pass slower than its heartbeat is abandoned,
	// and under load passes take hundreds of milliseconds.)
	o.Lease = leasestore.LeaseOptions{TTL: 6 * time.Second, Heartbeat: time.Second, Margin: 4 * time.Second}
	// Nothing is flushed unless the reader must (the timer's forced flush
	// comes every HandlerTimeout/4 at the most).
	o.CheckpointEvery, o.CheckpointInterval, o.HandlerTimeout = 10000, time.Hour, time.Hour
	if opt != nil {
		opt(&o, u.rec)
	}
	tel, spans := spanRecorder(t)
	u.spans = spans
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns, cfg.ConnConfig.Tracer = 12, tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	w := &testWorker{name: "w", sys: quietSystem(), pool: pool}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), Telemetry: tel, PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	o.Worker = "w"
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	u.w = w
	pgtest.Eventually(t, waitLong, func() bool { return u.rec.distinct() == 50 }, "the backlog handled")
	return u
}

// holdRenewals holds the worker's row: its passes (heartbeat and renewal)
// wait, and after TTL − Margin EnsureHeld fails. release (idempotent) lets
// them land.
func (u *unsureRun) holdRenewals(t *testing.T) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := u.store.Pool().Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{u.schema}.Sanitize()+`.lease_workers WHERE subscription = $1 AND worker = 'w' FOR UPDATE`, u.sub)
	require.NoError(t, err)
	return func() { _ = tx.Rollback(ctx) }
}

// An unsure reader whose checkpoint write fails while an event is still
// with its handler lets that event finish before it stops, as it does
// when the write succeeds: stopped at once, it dropped the event's answer,
// and the next reader at the same epoch delivered the event again.
func TestAnUnsureReaderWhoseWriteFailsFinishesItsEventInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	gate, started := make(chan struct{}), make(chan *actor.PID, 1)
	openGate := sync.OnceFunc(func() { close(gate) })
	defer openGate() // a failing test, too, lets the held handler go
	fails := &failedCheckpointWrites{}
	u := startUnsureIn(t, schema, "unsureflight", func(o *GroupOptions, rec *recorder) {
		o.DatabaseTimeout = 2 * time.Second
		o.CheckpointInterval = 100 * time.Millisecond // the timer writes what was acked
		o.Handler = gatedHandler(rec, gate, started)
	}, fails)
	pgtest.Eventually(t, waitLong, func() bool {
		cp, err := u.store.Checkpoint(ctx, "unsureflight", 0)
		return err == nil && cp == 50
	}, "the backlog checkpointed")
	before := holders(t, schema, "unsureflight")

	// From now on every checkpoint write waits for this lock and fails
	// after DatabaseTimeout.
	ck, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ck.Rollback(ctx) }()
	_, err = ck.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, "checkpoints"}.Sanitize()+` IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	// One event acked (the timer's writes of it fail), then one that
	// stays with the handler until the gate opens.
	_, err = u.store.Append(ctx, "acct-x", eventsource.Any, []eventsource.EventData{{Type: "Seeded", Data: []byte(`{}`)}})
	require.NoError(t, err)
	_, err = u.store.Append(ctx, "acct-y", eventsource.Any, []eventsource.EventData{{Type: "Gated", Data: []byte(`{}`)}})
	require.NoError(t, err)
	var reader *actor.PID
	select {
	case reader = <-started:
	case <-time.After(waitLong):
		t.Fatalf("the gated event was not delivered%s", u.w.diagnose())
	}

	release := u.holdRenewals(t)
	defer release()
	// A failed write finds the lease unsure (retryInPlace asks): the
	// reader drains, the gated event still in flight.
	pgtest.Eventually(t, waitLong, func() bool { return u.fenceLost() }, "the reader finds its lease unsure")
	k := fails.n.Load()
	// The next write, under the unsure lease, fails too; wait until the
	// reader has taken its failure.
	pgtest.Eventually(t, waitLong, func() bool { return fails.n.Load() > k && u.tookWriteFailure(reader) },
		"a write under the unsure lease failed (failed writes %d, %d before)", observed(fails.n.Load), k)
	openGate()
	require.NoError(t, ck.Rollback(ctx))
	release() // the renewal lands: the lease was held all along

	// The next reader's checkpoint covers the gated event: it started
	// after it, or delivered it again.
	pgtest.Eventually(t, waitLong, func() bool {
		cp, err := u.store.Checkpoint(ctx, "unsureflight", 0)
		return err == nil && cp == 52
	}, "the next reader checkpoints both events (handled %d)%s", observed(u.rec.distinct), observed(u.w.diagnose))
	require.Equal(t, 52, u.rec.distinct(), "both events handled")
	require.Equal(t, before, holders(t, schema, "unsureflight"), "the bucket held at the same epoch throughout")
	require.Zero(t, u.rec.duplicates(), "the event in flight was not delivered again")
}

// gatedHandler is ackHandler, but holds each event of type Gated until
// gate is closed, saying first (on started, if it has room) which reader
// delivered it.
func gatedHandler(rec *recorder, gate <-chan struct{}, started chan<- *actor.PID) *actor.Props {
	return actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			rec.begin("w", d.Event)
			if d.Event.Type == "Gated" {
				select {
				case started <- d.replyTo:
				default:
				}
				<-gate
			}
			rec.end("w", d.Event)
			ctx.Respond(Ack{})
		}
	})
}

// failedCheckpointWrites is a pgx tracer counting the checkpoint writes
// that failed.
type failedCheckpointWrites struct{ n atomic.Int64 }

type tracedSQL struct{}

func (f *failedCheckpointWrites) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, tracedSQL{}, data.SQL)
}

func (f *failedCheckpointWrites) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if sql, _ := ctx.Value(tracedSQL{}).(string); data.Err != nil && strings.Contains(sql, "INSERT INTO") && strings.Contains(sql, "checkpoints") {
		f.n.Add(1)
	}
}

// fenceLost reports whether a reader stopped trusting its lease.
func (u *unsureRun) fenceLost() bool {
	for _, s := range u.spans.GetSpans() {
		if s.Name == obsname.SpanLeaseFenceLost {
			return true
		}
	}
	return false
}

// tookWriteFailure reports whether the reader pid is gone, or runs unsure
// of its lease with no checkpoint write under way.
func (u *unsureRun) tookWriteFailure(pid *actor.PID) bool {
	alive := make(chan bool, 1)
	u.w.sys.Root.Send(u.w.group.coordinator, inspectCoordinator(func(c *coordinator) {
		found := false
		for _, ref := range c.readers {
			found = found || ref.pid.Equal(pid)
		}
		alive <- found
	}))
	select {
	case a := <-alive:
		if !a {
			return true
		}
	case <-time.After(5 * time.Second):
		return false
	}
	quiet := make(chan bool, 1)
	u.w.sys.Root.Send(pid, inspectReader(func(r *reader) { quiet <- r.unsure != nil && r.cp.Phase() != checkpointing.Writing }))
	select {
	case q := <-quiet:
		return q
	case <-time.After(time.Second): // stopped meanwhile: asked again
		return false
	}
}

// A reader stopped unsure of its lease, its last checkpoint write failed,
// leaves what it handled in its slot's mark, for the next reader at the
// same epoch. A graceful stop before any is spawned (the renewals still
// held) checkpoints that mark, fenced, before it releases the lease: the
// next owner starts after it. (Before, the leave released the slot with
// the older checkpoint, and the next owner delivered everything the
// reader had handled since. Found by internal/poolsim, mutation
// MarkUnwritten; a handover of such a slot takes the same path.)
func TestALeaveCheckpointsWhatAnUnsureReaderHandledAndCouldNotWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	var checkpoint func() int64
	u, release := stopUnsureUnwritten(t, schema, "unsureleave", func(o *GroupOptions) {
		// Usable for 2 s after a renewal, as in every unsure test, but
		// valid for 30 s: the leave's fenced write lands well before the
		// lease expires.
		o.Lease.TTL, o.Lease.Margin = 30*time.Second, 28*time.Second
	}, func(u *unsureRun) {
		checkpoint = func() int64 {
			cp, err := u.store.Checkpoint(ctx, "unsureleave", 0)
			require.NoError(t, err)
			return cp
		}
		require.Less(t, checkpoint(), int64(50), "the backlog handled, not checkpointed")
	})
	defer release()

	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		stopped <- u.w.rt.Stop(sctx)
	}()
	pgtest.Eventually(t, waitLong, func() bool { return checkpoint() == 50 },
		"the graceful stop checkpoints what the unsure reader handled (checkpoint %d)", observed(checkpoint))
	release()
	select {
	case <-stopped:
	case <-time.After(waitLong):
		t.Fatal("the graceful stop did not end")
	}
}
