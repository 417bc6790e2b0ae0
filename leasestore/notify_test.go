package leasestore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// woken waits for a Changes signal, failing the test after a deadline.
func woken(t *testing.T, s *Store, why string) {
	t.Helper()
	select {
	case <-s.Changes():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no notification", why)
	}
}

// drain consumes a pending signal, if any.
func drain(s *Store) {
	select {
	case <-s.Changes():
	default:
	}
}

func TestNotifications(t *testing.T) {
	t.Parallel()

	t.Run("OtherWorkersAreWokenOnJoinClaimReleaseHandoffAndLeave", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a"))
			woken(t, a, "the listener connected") // it looks once when it starts listening
			pass(t, a)

			bw := b.open(t, b.config(kind, 4, "b"))
			woken(t, a, "B joined")
			woken(t, bw, "B's listener connected")

			res := pass(t, bw) // places claims on A's surplus
			require.Len(t, res.Requested, 2)
			woken(t, a, "B claimed A's buckets")

			res = pass(t, a)
			require.Len(t, res.HandOff, 2)
			drain(bw)
			require.NoError(t, a.HandOver(context.Background(), res.HandOff[0]))
			woken(t, bw, "A handed over")
			require.Len(t, pass(t, bw).Claimed, 1)
			woken(t, a, "B activated its claim")

			drain(bw)
			held := buckets(a.Held())
			require.NoError(t, a.Release(context.Background(), held[:1]))
			woken(t, bw, "A released")

			drain(bw)
			require.NoError(t, a.Leave(context.Background()))
			woken(t, bw, "A left")
		})
	})

	t.Run("AWorkerIsNotWokenByItsOwnChanges", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a"))
			woken(t, a, "the listener connected")
			pass(t, a) // claims: notifies
			require.NoError(t, a.Release(context.Background(), []int{0}))
			pgtest.Eventually(t, 10*time.Second, func() bool { return a.received.Load() >= 2 },
				"A's own notifications never arrived")
			select {
			case <-a.Changes():
				t.Fatal("woken by its own notifications")
			default:
			}
		})
	})

	t.Run("NoListenNeverWakes", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			c := b.config(kind, 4, "a")
			c.NoListen = true
			a := b.open(t, c)
			b.open(t, b.config(kind, 4, "b"))
			pass(t, a)
			select {
			case <-a.Changes():
				t.Fatal("a store without a listener was woken")
			default:
			}
		})
	})
}

func TestLifecycle(t *testing.T) {
	t.Parallel()

	t.Run("CloseIsIdempotentAndSafeFromManyGoroutines", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			s := b.open(t, b.config(kind, 4, "a"))
			pass(t, s)
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() { defer wg.Done(); require.NoError(t, s.Close()) }()
			}
			wg.Wait()
			_, err := s.Pass(context.Background())
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorIs(t, s.EnsureHeld(0), ErrClosed)
			require.ErrorIs(t, s.Release(context.Background(), []int{0}), ErrClosed)
			require.ErrorIs(t, s.HandOver(context.Background(), 0), ErrClosed)
			require.ErrorIs(t, s.Leave(context.Background()), ErrClosed)
			require.ErrorIs(t, s.EnsureShards(context.Background()), ErrClosed)
		})
	})

	t.Run("AnEmptyWorkerIdMintsAUUID", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			s := b.open(t, b.config(kind, 1, ""))
			require.Len(t, s.Worker(), 36)
			require.Equal(t, s.Worker(), s.Config().Worker)
			require.Equal(t, TTLDefault/3, s.Config().Margin)
		})
	})

	t.Run("SnapshotShowsBucketsClaimsAndMembers", func(t *testing.T) {
		// Kind-specific by design: one worker of each kind side by side,
		// to show how a snapshot tells them apart.
		b := setup(t)
		a := b.open(t, b.config(KindRow, 2, "a"))
		pass(t, a)
		s := b.open(t, b.config(KindSession, 2, "s"))
		pass(t, s)
		snap, err := a.Snapshot(context.Background())
		require.NoError(t, err)
		require.Equal(t, "orders", snap.Subscription)
		require.Len(t, snap.Buckets, 2)
		require.Equal(t, "a", snap.Buckets[0].Owner)
		require.Equal(t, "s", snap.Buckets[1].ClaimWorker, "one pending claim on A's surplus")
		require.False(t, snap.Buckets[1].ClaimedAt.IsZero())
		require.False(t, snap.Buckets[0].GrantedAt.After(snap.Now))
		require.Len(t, snap.Members, 2)
		require.Equal(t, KindRow, snap.Members[0].Kind)
		require.Equal(t, KindSession, snap.Members[1].Kind)
		require.Equal(t, int(s.session.backendPID()), snap.Members[1].BackendPID)
		require.True(t, snap.Members[1].Live)
		require.False(t, snap.Members[1].SessionGone)
	})
}
