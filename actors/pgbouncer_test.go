package actors

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// startBouncedWorker is startWorker with every connection of the worker —
// pool, sequencer, notifier — going through bouncer, and the lease store's
// LISTEN off (NoListen), as docs/operations.md says to run behind a
// transaction pooler.
func startBouncedWorker(t *testing.T, bouncer *pgtest.Bouncer, schema, name string, opts GroupOptions) *testWorker {
	t.Helper()
	opts.Lease.NoListen = true
	return startWorkerOn(t, pgtest.PoolOn(t, bouncer.URL, 12), schema, name, opts)
}

// TestGroupThroughATransactionPooler: two workers whose every connection
// goes through a real PgBouncer 1.18 in transaction mode, with the
// documented URL (default_query_exec_mode=exec) and row leases without
// LISTEN, append, deliver, checkpoint and rebalance — a second worker
// joining, then one killed — and every event is handled exactly once, in
// order per stream. The notifier's LISTEN through the pooler hears
// nothing; the publisher's poll carries the new events.
func TestGroupThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.LocalServer(t)
	schema := pgtest.NewSchema(t)
	direct, err := eventsource.New(pgtest.PoolOn(t, srv.URL, 2), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, Migrate(ctx, direct), "migrated over a direct connection")
	require.NoError(t, direct.EnsureConsumerGroupIndex(ctx, 6), "the group index built over a direct connection, as docs/operations.md says")
	bouncer := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction)
	rec := newRecorder()

	a := startBouncedWorker(t, bouncer, schema, "a", groupOpts("pooled", 6, rec, "a"))
	appender, err := eventsource.New(a.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	seed(t, appender, "acct", 30, 300)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 300 }, "a handles the first 300 (got %d)", observed(rec.distinct))

	b := startBouncedWorker(t, bouncer, schema, "b", groupOpts("pooled", 6, rec, "b"))
	pgtest.Eventually(t, waitLong, func() bool { return fairSplit(6, a, b) }, "b gets its share without LISTEN: %v", owners(a, b))
	seed(t, appender, "acct", 30, 300)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 600 }, "600 handled (got %d)", observed(rec.distinct))

	a.kill(t)
	bStore, err := eventsource.New(b.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	seed(t, bStore, "acct", 30, 300)
	pgtest.Eventually(t, waitLong, func() bool { return len(b.owned()) == 6 }, "b takes the killed worker's buckets: %v", owners(b))
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 900 }, "all 900 handled (got %d)", observed(rec.distinct))
	require.Empty(t, rec.overlaps, "no stream handled by two workers at once")
	require.Empty(t, rec.order, "per-stream order")

	b.stop(t)
	cps, err := bStore.Checkpoints(ctx, "pooled")
	require.NoError(t, err)
	require.Len(t, cps, 6, "every bucket has a checkpoint, written through the pooler")
}
