package actors

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
)

// A renewal that runs late makes EnsureHeld fail although the lease is
// still held; the reader stops, and the next pass respawns it. What it
// acked before it stopped must not be delivered again: it writes its
// acked position (fenced) before it stops.
func TestASurvivedRenewalFailureRedeliversNothing(t *testing.T) {
	t.Parallel()
	u := startUnsure(t, "unsure", nil)
	release := u.holdRenewals(t)
	defer release()
	pgtest.Eventually(t, waitLong, func() bool { return u.w.group.g.leases.EnsureHeld(0) != nil }, "the lease becomes unsure")
	seed(t, u.store, "acct", 1, 1) // the next delivery finds it unsure
	pgtest.Eventually(t, waitLong, func() bool {
		for _, s := range u.spans.GetSpans() {
			if s.Name == observability.SpanLeaseFenceLost {
				return true
			}
		}
		return false
	}, "the reader stops on the unsure lease")
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
	ctx := context.Background()
	_, schema := newTestStore(t)
	// Every checkpoint write waits for this lock, and gives up after
	// DatabaseTimeout: none lands until the lock is released (so the
	// backlog's acks cannot reach the checkpoint by a timely flush).
	ck, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ck.Rollback(ctx) }()
	_, err = ck.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, "checkpoints"}.Sanitize()+` IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	u := startUnsureIn(t, schema, "unsurelast", func(o *GroupOptions) { o.DatabaseTimeout = 2 * time.Second })
	before := holders(t, schema, "unsurelast")

	release := u.holdRenewals(t)
	defer release()
	pgtest.Eventually(t, waitLong, func() bool { return u.w.group.g.leases.EnsureHeld(0) != nil }, "the lease becomes unsure")
	seed(t, u.store, "acct", 1, 1) // the next delivery finds it unsure
	// The reader drains: its last write waits for the lock and fails, and
	// it stops; the coordinator forgets the bucket until a pass says.
	pgtest.Eventually(t, waitLong, func() bool { return len(u.w.owned()) == 0 },
		"the reader stops on the unsure lease after its last write failed (owned %v)%s", observed(u.w.owned), observed(u.w.diagnose))
	require.NoError(t, ck.Rollback(ctx))
	release() // the renewal lands: the lease was held all along

	pgtest.Eventually(t, waitLong, func() bool { return u.rec.distinct() == 51 }, "the new event handled by the respawned reader (got %d)%s",
		observed(u.rec.distinct), observed(u.w.diagnose))
	require.Equal(t, before, holders(t, schema, "unsurelast"), "the bucket held at the same epoch throughout")
	require.Zero(t, u.rec.duplicates(), "nothing acked before the stop was delivered again")
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

// startUnsure is startUnsureIn on a schema of its own.
func startUnsure(t *testing.T, sub string, opt func(*GroupOptions)) *unsureRun {
	t.Helper()
	_, schema := newTestStore(t)
	return startUnsureIn(t, schema, sub, opt)
}

// startUnsureIn starts worker w on a one-bucket subscription whose lease
// is usable for 2 s after a renewal and valid for 6 s, and that flushes
// its checkpoint only when it must, and waits until w handled a backlog
// of 50 events. opt, if not nil, adjusts the options.
func startUnsureIn(t *testing.T, schema, sub string, opt func(*GroupOptions)) *unsureRun {
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
	o.Lease = LeaseOptions{TTL: 6 * time.Second, Heartbeat: time.Second, Margin: 4 * time.Second}
	// Nothing is flushed unless the reader must (the timer's forced flush
	// comes every HandlerTimeout/4 at the most).
	o.CheckpointEvery, o.CheckpointInterval, o.HandlerTimeout = 10000, time.Hour, time.Hour
	if opt != nil {
		opt(&o)
	}
	tel, spans := spanRecorder(t)
	u.spans = spans
	w := &testWorker{name: "w", sys: quietSystem(), pool: pgtest.NewPool(t, 12)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = NewRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), Telemetry: tel, PollInterval: 200 * time.Millisecond})
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
