package leasestore

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// bouncerPool is a pool of its own through bouncer b, closed when the test
// ends.
func bouncerPool(t *testing.T, b *pgtest.Bouncer) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolOn(t, b.URL, 0)
}

// localSetup is setup on a server a bouncer can be put in front of
// (pgtest.LocalServer), with a pool of its own.
func localSetup(t *testing.T) (*testBundle, *pgtest.Server) {
	t.Helper()
	srv := pgtest.LocalServer(t)
	b := &testBundle{pool: pgtest.PoolOn(t, srv.URL, 10), schema: pgtest.NewSchema(t), sub: "orders"}
	require.NoError(t, Migrate(context.Background(), b.pool, b.schema))
	return b, srv
}

// TestSessionKindBehindARealPgBouncer: the session kind is judged by what
// its connection does, not by what its URL looks like. Through PgBouncer in
// transaction mode, on a port that is not 6432, the session's server
// connection goes back to the pool between statements (another client's
// transaction runs on the backend that holds the lock), and New refuses it
// with a *SessionPoolerError; through session pooling it works, including
// the evidence it exists for: a closed session frees its buckets at once.
func TestSessionKindBehindARealPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TheSessionThroughATransactionPoolerIsRefused", func(t *testing.T) {
		b, srv := localSetup(t)
		bouncer := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction)
		require.NotEqual(t, 6432, bouncer.Port())
		cfg := b.config(KindSession, 4, "a")
		cfg.SessionURL = bouncer.URL
		_, err := startedStore(ctx, b.pool, cfg)
		var pe *SessionPoolerError
		require.ErrorAs(t, err, &pe, "got %v", err)
		require.NotContains(t, err.Error(), bouncer.URL)

		// Nothing joined: a rival sees no worker but itself.
		rival := b.open(t, b.config(KindSession, 4, "b"))
		res := pass(t, rival)
		require.Equal(t, 1, res.Live)
		require.Len(t, res.Owned, 4)
	})

	t.Run("APoolAndSessionBothThroughATransactionPoolerAreRefused", func(t *testing.T) {
		b, srv := localSetup(t)
		bouncer := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction)
		_, err := startedStore(ctx, bouncerPool(t, bouncer), b.config(KindSession, 4, "a"))
		var pe *SessionPoolerError
		require.ErrorAs(t, err, &pe, "got %v", err)
	})

	t.Run("ADirectSessionBesideAPoolThroughATransactionPoolerWorks", func(t *testing.T) {
		b, srv := localSetup(t)
		bouncer := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction)
		pooled := bouncerPool(t, bouncer)
		cfg := b.config(KindSession, 4, "a")
		cfg.SessionURL, cfg.NoListen = srv.URL, true
		a := openOn(t, pooled, cfg)
		require.Len(t, pass(t, a).Owned, 4)
		require.NoError(t, a.EnsureHeld(0))
		rcfg := b.config(KindSession, 4, "b")
		rcfg.SessionURL, rcfg.NoListen = srv.URL, true
		rival := openOn(t, pooled, rcfg)
		res := pass(t, rival)
		require.Equal(t, 2, res.Live, "the pooled pool sees a's session lock")
		require.Empty(t, res.Owned)
	})

	t.Run("TheSessionThroughSessionPoolingWorks", func(t *testing.T) {
		b, srv := localSetup(t)
		bouncer := pgtest.NewBouncer(t, srv, pgtest.PoolSession)
		cfg := b.config(KindSession, 4, "a")
		cfg.SessionURL = bouncer.URL
		a, err := startedStore(ctx, b.pool, cfg)
		require.NoError(t, err)
		require.Len(t, pass(t, a).Owned, 4)
		require.NoError(t, a.EnsureHeld(0))

		rival := b.open(t, b.config(KindSession, 4, "b"))
		res := pass(t, rival)
		require.Equal(t, 2, res.Live, "the rival sees a's session lock through the bouncer")
		require.Empty(t, res.Owned, "and leaves its buckets alone (TTL 30s: none expired)")

		// The bouncer resets the server connection when a's client goes:
		// the lock goes with it, and the rival moves in without a TTL.
		require.NoError(t, a.Stop(context.Background()))
		pgtest.Eventually(t, 30e9, func() bool { return len(pass(t, rival).Owned) == 4 },
			"the rival takes a's buckets once a's session is gone")
	})

	t.Run("ASessionWhoseStatementsMoveToAnotherBackendIsRefusedOnThePass", func(t *testing.T) {
		// A transaction pooler that passed the opening probe (round-robin
		// selection, a busy pool) shows itself when one of the session's
		// statements runs on another backend than the lock's. Played here
		// by swapping the session's connection for one through a
		// transaction pooler: its statements run elsewhere.
		b, srv := localSetup(t)
		a := b.open(t, b.config(KindSession, 4, "a"))
		require.Len(t, pass(t, a).Owned, 4)
		bouncer := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction)
		moved, err := pgx.Connect(ctx, bouncer.URL)
		require.NoError(t, err)
		require.NoError(t, a.session.acquire(ctx))
		original := a.session.conn
		a.session.conn = moved
		a.session.release()
		t.Cleanup(func() { _ = original.Close(context.Background()) })

		err = a.EnsureHeld(0)
		require.ErrorIs(t, err, ErrNotHeld)
		require.ErrorContains(t, err, "transaction pooler")
		_, err = a.Pass(ctx)
		var pe *SessionPoolerError
		require.ErrorAs(t, err, &pe, "got %v", err)
		require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld)
	})
}
