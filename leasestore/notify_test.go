package leasestore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// woken waits for a Changes signal, failing the test after a deadline.
func woken(t *testing.T, s *Store, why string) {
	t.Helper()
	select {
	case <-s.Changes():
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no notification in 30 s (%d received, its own included)", why, s.received.Load())
	}
}

// drain consumes a pending signal, if any.
func drain(s *Store) {
	select {
	case <-s.Changes():
	default:
	}
}

// sharedNotifier returns a running notifier, stopped when the test ends,
// for stores to share as a process's stores share the runtime's.
func sharedNotifier(t *testing.T) *eventsource.Notifier {
	t.Helper()
	n, err := eventsource.NewNotifier(pgtest.Pool(t), eventsource.NotifierOptions{
		Channels: []string{"kumi_test_process"}, PollInterval: -1,
	})
	require.NoError(t, err)
	require.NoError(t, n.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, n.Stop(context.Background())) })
	return n
}

// TestNotifications runs each case with the store's own listener and with
// a notifier shared by the stores (Config.Notifier).
func TestNotifications(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{false, true} {
		name := "OwnListener"
		if shared {
			name = "SharedNotifier"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testNotifications(t, func(t *testing.T) func(Config) Config {
				if !shared {
					return func(c Config) Config { return c }
				}
				n := sharedNotifier(t)
				return func(c Config) Config { c.Notifier = n; return c }
			})
		})
	}

	t.Run("OneSharedNotifierIsOneListenSessionForEveryStore", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		n := sharedNotifier(t)
		var channels []string
		for _, sub := range []string{"orders", "invoices"} {
			for _, w := range []string{"a", "b"} {
				c := b.config(KindSession, 2, w)
				c.Subscription, c.Notifier = sub, n
				s := b.open(t, c)
				woken(t, s, "listening on the shared notifier")
			}
			channels = append(channels, ChannelName(b.schema, sub))
		}
		require.Equal(t, 1, listenSessions(t, channels...), "one session listens for four stores")
		require.Equal(t, int64(1), n.Stats().Connects)

		own := b.config(KindRow, 2, "own")
		own.Subscription = "payments"
		woken(t, b.open(t, own), "listening on its own")
		require.Equal(t, 1, listenSessions(t, ChannelName(b.schema, "payments")),
			"without a notifier a store listens on a connection of its own")
	})
}

// listenSessions returns how many server sessions listen on any of the
// channels: the backends whose last statement was a LISTEN on one of them.
func listenSessions(t *testing.T, channels ...string) int {
	t.Helper()
	var stmts []string
	for _, c := range channels {
		stmts = append(stmts, "LISTEN "+pgx.Identifier{c}.Sanitize())
	}
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE query = ANY($1)", stmts).Scan(&n))
	return n
}

func testNotifications(t *testing.T, newListen func(t *testing.T) func(Config) Config) {
	t.Run("OtherWorkersAreWokenOnJoinClaimReleaseHandoffAndLeave", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			listen := newListen(t)
			a := b.open(t, listen(b.config(kind, 4, "a")))
			woken(t, a, "the listener connected") // it looks once when it starts listening
			pass(t, a)

			bw := b.open(t, listen(b.config(kind, 4, "b")))
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
			a := b.open(t, newListen(t)(b.config(kind, 4, "a")))
			woken(t, a, "the listener connected")
			pass(t, a) // claims: notifies
			require.NoError(t, a.Release(context.Background(), []int{0}))
			pgtest.Eventually(t, 30*time.Second, func() bool { return a.received.Load() >= 2 },
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
			listen := newListen(t)
			c := listen(b.config(kind, 4, "a"))
			c.NoListen = true
			a := b.open(t, c)
			woken(t, b.open(t, listen(b.config(kind, 4, "b"))), "the other worker listens")
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
				go func() { defer wg.Done(); require.NoError(t, s.Stop(context.Background())) }()
			}
			wg.Wait()
			_, err := s.Pass(context.Background())
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorIs(t, s.EnsureHeld(0), ErrClosed)
			require.ErrorIs(t, s.Release(context.Background(), []int{0}), ErrClosed)
			require.ErrorIs(t, s.HandOver(context.Background(), 0), ErrClosed)
			require.ErrorIs(t, s.Leave(context.Background()), ErrClosed)
			require.ErrorIs(t, s.EnsureBuckets(context.Background()), ErrClosed)
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

	t.Run("SnapshotShowsBucketsClaimsAndWorkers", func(t *testing.T) {
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
		require.Len(t, snap.Workers, 2)
		require.Equal(t, KindRow, snap.Workers[0].Kind)
		require.Equal(t, KindSession, snap.Workers[1].Kind)
		require.Equal(t, int(s.session.backendPID()), snap.Workers[1].BackendPID)
		require.True(t, snap.Workers[1].Live)
		require.False(t, snap.Workers[1].SessionGone)
	})
}
