package leasestore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// forEachKind runs one behavioural test once per lease kind: the suite both
// kinds must pass.
func forEachKind(t *testing.T, test func(t *testing.T, kind Kind)) {
	for _, kind := range []Kind{KindRow, KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			test(t, kind)
		})
	}
}

// shortTTL gives a config leases that expire in a fraction of a second, with
// a heartbeat long enough for a pass on a loaded test machine.
func shortTTL(c Config) Config {
	c.TTL, c.Heartbeat, c.Margin = 600*time.Millisecond, 250*time.Millisecond, 200*time.Millisecond
	return c
}

// The keiro suite (Keiro.Subscription.Shard), ported, for both kinds.
func TestKeiroSuite(t *testing.T) {
	t.Parallel()

	t.Run("EnsureShardsIsIdempotentAndSafeConcurrently", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			s := b.open(t, b.config(kind, 16, "a"))
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = s.EnsureShards(context.Background()) }()
			}
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.NoError(t, s.EnsureShards(context.Background()))
			snap, err := s.Snapshot(context.Background())
			require.NoError(t, err)
			require.Len(t, snap.Buckets, 16)
			for i, bk := range snap.Buckets {
				require.Equal(t, i, bk.Bucket)
				require.Equal(t, 16, bk.ShardCount)
				require.Empty(t, bk.Owner)
				require.Zero(t, bk.Epoch)
			}
		})
	})

	t.Run("AClaimsAllBucketsWhileBGetsNone", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 6, "a"))
			res := pass(t, a)
			require.Equal(t, seq(0, 6), buckets(res.Owned), "alone, A's fair share is everything")
			require.Equal(t, seq(0, 6), buckets(res.Claimed))
			require.Equal(t, 1, res.Live)

			bw := b.open(t, b.config(kind, 6, "b"))
			res = pass(t, bw)
			require.Empty(t, res.Owned, "every bucket is held by a live owner: B only places claims")
			require.Equal(t, 2, res.Live)
			require.Equal(t, 3, res.FairShare)
			require.Len(t, res.Pending, 3, "B claims its share from A's surplus, two-phase")
		})
	})

	t.Run("BClaimsAsBucketsAfterExpiryAndAsRenewThenReturnsNothing", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, shortTTL(b.config(kind, 4, "a")))
			require.Len(t, pass(t, a).Owned, 4)
			// A stops renewing (its session, if any, stays up): only expiry frees its buckets.
			bw := b.open(t, shortTTL(b.config(kind, 4, "b")))
			var got PassResult
			pgtest.Eventually(t, 10*time.Second, func() bool {
				got = pass(t, bw)
				return len(got.Owned) == 4
			}, "B never took A's expired buckets")
			for _, tk := range got.Takeovers {
				require.Equal(t, "a", tk.From)
				require.Equal(t, EvidenceExpired, tk.Evidence)
				require.EqualValues(t, 2, tk.Epoch, "a change of owner bumps the epoch")
			}
			res, err := a.Renew(context.Background())
			require.NoError(t, err)
			require.Empty(t, res.Owned)
			require.Equal(t, seq(0, 4), res.Lost)
			require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld)
		})
	})

	t.Run("RenewReturnsOnlyBucketsStillHeld", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a"))
			require.Len(t, pass(t, a).Owned, 4)
			require.NoError(t, a.Release(context.Background(), []int{1, 2}))
			require.ErrorIs(t, a.EnsureHeld(1), ErrNotHeld, "a released bucket is given up at once")
			res, err := a.Renew(context.Background())
			require.NoError(t, err)
			require.Equal(t, []int{0, 3}, buckets(res.Owned))
			require.Empty(t, res.Lost, "released buckets were given up, not lost")
			require.Empty(t, res.Claimed, "Renew never claims")
		})
	})

	t.Run("ReleasedBucketsAreClaimableAtOnce", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a")) // 30s TTL: only the release frees them
			require.Len(t, pass(t, a).Owned, 4)
			bw := b.open(t, b.config(kind, 4, "b"))
			require.NoError(t, a.Release(context.Background(), []int{1, 3}))
			res := pass(t, bw)
			require.Equal(t, []int{1, 3}, buckets(res.Claimed))
			require.Empty(t, res.Takeovers, "a released bucket is free, not taken over")
			for _, l := range res.Claimed {
				require.EqualValues(t, 2, l.Epoch)
			}
		})
	})

	t.Run("FailedPassKeepsPreviousOwnership", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a"))
			first := pass(t, a)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := a.Pass(ctx)
			require.Error(t, err)
			require.Equal(t, first.Owned, a.Held(), "a failed pass changes nothing")
			require.NoError(t, a.EnsureHeld(2))
			res := pass(t, a)
			require.Equal(t, buckets(first.Owned), buckets(res.Owned))
			require.Empty(t, res.Lost)
			require.Empty(t, res.Claimed)
		})
	})

	t.Run("ShardCountMismatchLeavesNoPartialRows", func(t *testing.T) {
		b := setup(t)
		s4 := b.open(t, b.config(KindRow, 4, "a"))
		require.NoError(t, s4.EnsureShards(context.Background()))
		s8 := b.open(t, b.config(KindRow, 8, "b"))
		err := s8.EnsureShards(context.Background())
		var mismatch *ShardCountMismatchError
		require.ErrorAs(t, err, &mismatch)
		require.Equal(t, ShardCountMismatchError{Subscription: "orders", Configured: 8, Found: 4}, *mismatch)
		var formerName *ShardCountMismatch // the deprecated name still matches: callers do not break
		require.ErrorAs(t, err, &formerName)
		require.Contains(t, err.Error(), "configure 4")
		_, err = s8.Pass(context.Background())
		require.ErrorAs(t, err, &mismatch, "a pass ensures the rows first, and fails the same way")
		var rows, maxBucket int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			"SELECT count(*), max(bucket) FROM "+pgx.Identifier{b.schema, "lease_buckets"}.Sanitize()).Scan(&rows, &maxBucket))
		require.Equal(t, 4, rows)
		require.Equal(t, 3, maxBucket)
	})

	t.Run("FairShareTable", func(t *testing.T) {
		for _, tc := range []struct{ n, live, want int }{
			{6, 3, 2}, {6, 4, 2}, {7, 3, 3}, {4, 0, 4}, {4, -1, 4}, {1, 5, 1}, {1024, 32, 32}, {10, 3, 4},
		} {
			require.Equal(t, tc.want, FairShare(tc.n, tc.live), "FairShare(%d, %d)", tc.n, tc.live)
		}
	})

	t.Run("MissingTablesSuggestMigrate", func(t *testing.T) {
		b := &testBundle{pool: pgtest.Pool(t), schema: pgtest.NewSchema(t), sub: "orders"}
		_, err := New(context.Background(), b.pool, b.config(KindRow, 4, "a"))
		require.Error(t, err)
		require.Contains(t, err.Error(), "run leasestore.Migrate")
		require.False(t, errors.Is(err, ErrNotHeld))
	})
}
