package leasestore

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/kumierr"
)

// sharedWorker opens k KindSession stores of worker, one per subscription
// sub-0 … sub-(k-1) of n buckets, all on ss, and runs a pass of each.
func sharedWorker(t *testing.T, b *testBundle, ss *Sessions, worker string, k, n int) []*Store {
	t.Helper()
	stores := make([]*Store, k)
	for i := range stores {
		c := b.config(KindSession, n, worker)
		c.Subscription, c.Sessions = fmt.Sprintf("sub-%d", i), ss
		stores[i] = b.open(t, c)
		require.NoError(t, stores[i].EnsureBuckets(context.Background()))
		pass(t, stores[i])
	}
	return stores
}

// The shared session connection of a process (Sessions, issue 27): one
// connection for every KindSession store of the process, one lock per
// (subscription, worker) on it.
func TestSharedSessions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ManyStoresHoldTheirLocksOnOneConnection", func(t *testing.T) {
		b := setup(t)
		ss, err := NewSessions(b.pool, b.schema, "")
		require.NoError(t, err)
		t.Cleanup(ss.Close)
		stores := sharedWorker(t, b, ss, "a", 5, 2)
		pid := int32(ss.BackendPID())
		require.NotZero(t, pid)
		for _, s := range stores {
			require.Equal(t, pid, lockHolder(t, b, s.session.key), "every store's lock is on the one connection")
			require.Len(t, s.Held(), 2)
			require.NoError(t, s.EnsureHeld(0))
		}
		var locks int
		require.NoError(t, b.pool.QueryRow(ctx,
			"SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND granted", pid).Scan(&locks))
		require.Equal(t, 5, locks, "one lock per (subscription, worker)")
	})

	t.Run("AStoreThatStopsReleasesItsLockAlone", func(t *testing.T) {
		b := setup(t)
		ss, err := NewSessions(b.pool, b.schema, "")
		require.NoError(t, err)
		t.Cleanup(ss.Close)
		stores := sharedWorker(t, b, ss, "a", 3, 2)
		pid := int32(ss.BackendPID())
		gone := stores[0].session.key
		require.NoError(t, stores[0].Stop(ctx))
		require.Zero(t, lockHolder(t, b, gone), "the stopped store's worker is gone to the others at once")
		require.Equal(t, pid, int32(ss.BackendPID()), "the connection stays")
		for _, s := range stores[1:] {
			require.Equal(t, pid, lockHolder(t, b, s.session.key))
			require.NoError(t, s.EnsureHeld(0))
		}
		for _, s := range stores[1:] {
			require.NoError(t, s.Stop(ctx))
		}
		require.Zero(t, ss.BackendPID(), "the last store's stop closes the connection")
	})

	t.Run("TheConnectionKilledLeavesEveryStoreUnsureUntilItsNextPass", func(t *testing.T) {
		b := setup(t)
		ss, err := NewSessions(b.pool, b.schema, "")
		require.NoError(t, err)
		t.Cleanup(ss.Close)
		stores := sharedWorker(t, b, ss, "a", 3, 2)
		var killed bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", ss.BackendPID()).Scan(&killed))
		require.True(t, killed)
		for _, s := range stores {
			require.ErrorIs(t, s.EnsureHeld(0), ErrNotHeld, "every store's lease is unsure once the shared session is gone")
		}
		// A rival takes what the dead session vouched for, by evidence.
		rival := b.open(t, func() Config {
			c := b.config(KindSession, 2, "r")
			c.Subscription = "sub-1"
			return c
		}())
		res := pass(t, rival)
		require.Equal(t, 1, res.Live, "a worker whose shared session is gone is not live")
		require.Len(t, res.Owned, 2)
		for _, tk := range res.Takeovers {
			require.Equal(t, EvidenceSessionGone, tk.Evidence)
		}
		// Each store's next pass reopens (or finds reopened) the
		// connection and takes its lock again, under a new session.
		for _, s := range stores {
			pass(t, s)
		}
		pid := int32(ss.BackendPID())
		require.NotZero(t, pid)
		for i, s := range stores {
			require.Equal(t, pid, lockHolder(t, b, s.session.key), "store %d's lock is on the new connection", i)
		}
		require.Empty(t, stores[1].Held(), "the bucket the rival took is not the store's")
		require.NoError(t, stores[0].EnsureHeld(0), "a lease confirmed under the new session is vouched for")
		require.NoError(t, stores[2].EnsureHeld(0))
	})

	t.Run("TheSameSubscriptionAndWorkerTwiceOnOneConnectionIsRefused", func(t *testing.T) {
		b := setup(t)
		ss, err := NewSessions(b.pool, b.schema, "")
		require.NoError(t, err)
		t.Cleanup(ss.Close)
		c := b.config(KindSession, 2, "twin")
		c.Sessions = ss
		first := b.open(t, c)
		require.NoError(t, first.EnsureBuckets(ctx))
		pass(t, first)
		_, err = startedStore(ctx, b.pool, c)
		require.ErrorIs(t, err, errSessionLockHeld, "an advisory lock is re-entrant within its session: it must not be granted twice")
		require.Equal(t, int32(ss.BackendPID()), lockHolder(t, b, first.session.key),
			"the refused store's undo leaves the first's lock alone")
		require.NoError(t, first.EnsureHeld(0))
	})

	t.Run("ASessionsOfAnotherSchemaIsRefusedNamingTheField", func(t *testing.T) {
		b := setup(t)
		ss, err := NewSessions(b.pool, "elsewhere", "")
		require.NoError(t, err)
		t.Cleanup(ss.Close)
		c := b.config(KindSession, 2, "a")
		c.Sessions = ss
		_, err = New(b.pool, c)
		var ce *kumierr.ConfigError
		require.True(t, errors.As(err, &ce), "%v", err)
		require.Equal(t, "leasestore.Config.Sessions", ce.Field)
	})
}
