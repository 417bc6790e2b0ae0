package leasestore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// A cancel request that lands on a join whose caller did not cancel it —
// one sent for a statement that had just ended on the same pooled
// backend — fails neither the join nor the store's Start: the join is
// tried again. Here the join waits on its worker row's lock (held by the
// test) when the test cancels its backend, as a stray cancel would.
func TestAJoinCancelledByAStrayCancelIsTriedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := b.config(KindRow, 2, "a")
	first, err := startedStore(ctx, b.pool, cfg)
	require.NoError(t, err)
	require.NoError(t, first.Stop(ctx)) // no Leave: the worker row stays

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{b.schema, "lease_workers"}.Sanitize()+
		" WHERE subscription = $1 AND worker = $2 FOR UPDATE", b.sub, "a")
	require.NoError(t, err)

	started := make(chan error, 1)
	var again *Store
	go func() {
		var err error
		again, err = startedStore(ctx, b.pool, cfg)
		started <- err
	}()
	type waiter struct {
		pid   int32
		since time.Time
	}
	waiting := func() (w waiter, ok bool) {
		err := b.pool.QueryRow(ctx, `SELECT pid, query_start FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND state = 'active' AND strpos(query, $1) > 0 AND strpos(query, 'lease_workers') > 0`,
			b.schema).Scan(&w.pid, &w.since)
		return w, err == nil
	}
	var join waiter
	pgtest.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		join, ok = waiting()
		return ok
	}, "the join waits on its worker row's lock")
	var cancelled bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_cancel_backend($1)", join.pid).Scan(&cancelled))
	require.True(t, cancelled)
	// The cancel has landed once the join has failed or waits again.
	var res error
	done := false
	pgtest.Eventually(t, 30*time.Second, func() bool {
		select {
		case res = <-started:
			done = true
			return true
		default:
		}
		w, ok := waiting()
		return ok && w.since.After(join.since)
	}, "the cancelled join fails or joins again")
	require.NoError(t, tx.Commit(ctx))
	if !done {
		res = <-started
	}
	if res != nil && strings.Contains(res.Error(), "57014") {
		t.Fatalf("the store's Start failed on a cancel its caller did not make: %v", res)
	}
	require.NoError(t, res)
	t.Cleanup(func() { _ = again.Stop(context.Background()) })
	require.NoError(t, again.EnsureBuckets(ctx))
	require.Len(t, pass(t, again).Owned, 2)
}
