package actors

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

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
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 5, 50)
	rec := newRecorder()
	o := groupOpts("unsure", 1, rec, "w")
	// Usable for 2 s after a renewal; valid for 6 s: a renewal held up for
	// a little over two seconds leaves the lease held but unsure. (A
	// heartbeat of a second: a pass slower than its heartbeat is abandoned,
	// and under load passes take hundreds of milliseconds.)
	o.Lease = LeaseOptions{TTL: 6 * time.Second, Heartbeat: time.Second, Margin: 4 * time.Second}
	// Nothing is flushed unless the reader must.
	o.CheckpointEvery, o.CheckpointInterval = 10000, time.Hour
	tel, spans := spanRecorder(t)
	w := &testWorker{name: "w", sys: quietSystem(), pool: pgtest.NewPool(t, 12)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = NewRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), Telemetry: tel, PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	o.Worker = "w"
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 50 }, "the backlog handled")

	// Hold the worker's row: its passes (heartbeat and renewal)
	// wait, and after TTL − Margin EnsureHeld fails.
	tx, err := store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{schema}.Sanitize()+`.lease_workers WHERE subscription = 'unsure' AND worker = 'w' FOR UPDATE`)
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return w.group.g.leases.EnsureHeld(0) != nil }, "the lease becomes unsure")
	seed(t, store, "acct", 1, 1) // the next delivery finds it unsure
	pgtest.Eventually(t, waitLong, func() bool {
		for _, s := range spans.GetSpans() {
			if s.Name == observability.SpanLeaseFenceLost {
				return true
			}
		}
		return false
	}, "the reader stops on the unsure lease")
	require.NoError(t, tx.Rollback(ctx)) // the renewal lands: the lease was held all along

	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 51 }, "the new event handled by the respawned reader")
	require.Zero(t, rec.duplicates(), "nothing acked before the stop was delivered again")
}
