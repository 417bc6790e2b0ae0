package leasestore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// balancedPair returns two workers of kind holding 4 of 8 buckets each.
func balancedPair(t *testing.T, b *testBundle, kind Kind, cfg func(Config) Config) (a, bw *Store) {
	t.Helper()
	a = b.open(t, cfg(b.config(kind, 8, "a")))
	bw = b.open(t, cfg(b.config(kind, 8, "b")))
	round(t, []*Store{a, bw})
	require.Len(t, a.Held(), 4)
	require.Len(t, bw.Held(), 4)
	return a, bw
}

// What the kinds do differently: each test runs under the kinds that have
// (or lack) the feature it is about.
func TestLeaseKinds(t *testing.T) {
	t.Parallel()
	same := func(c Config) Config { return c }

	t.Run("SessionEvidenceMovesAKilledWorkersBucketsOnTheNextPassWithoutATTLWait", func(t *testing.T) {
		forKindsWhere(t, withSessionEvidence, func(t *testing.T, kind Kind) {
			b := setup(t)
			a, bw := balancedPair(t, b, kind, same) // 30s TTL: any takeover within the test is by evidence
			lostByA := buckets(a.Held())
			var killed bool
			require.NoError(t, b.pool.QueryRow(context.Background(),
				"SELECT pg_terminate_backend($1, 5000)", a.session.backendPID()).Scan(&killed))
			require.True(t, killed)

			res := pass(t, bw)
			require.Equal(t, 1, res.Live, "a worker whose session is gone is not live")
			require.Len(t, res.Owned, 8)
			require.Equal(t, lostByA, buckets(res.Claimed))
			for _, tk := range res.Takeovers {
				require.Equal(t, "a", tk.From)
				require.Equal(t, EvidenceSessionGone, tk.Evidence)
				require.EqualValues(t, 2, tk.Epoch)
			}
			for _, bk := range lostByA {
				require.ErrorIs(t, a.EnsureHeld(bk), ErrNotHeld, "A's EnsureHeld asks its dead session")
			}

			res = pass(t, a) // A opens a new session and rejoins
			require.Equal(t, lostByA, res.Lost)
			require.Empty(t, res.Owned)
			require.Equal(t, 2, res.Live)
			require.Len(t, res.Pending, 4, "and claims its share back, two-phase")
		})
	})

	t.Run("SessionEvidenceTreatsAClosedWorkerAsGoneAtOnce", func(t *testing.T) {
		forKindsWhere(t, withSessionEvidence, func(t *testing.T, kind Kind) {
			b := setup(t)
			a, bw := balancedPair(t, b, kind, same)
			require.NoError(t, a.Stop(context.Background())) // the process ends without Leave: its socket closes
			var res PassResult
			eventually(t, 30*time.Second, func() bool {
				res = pass(t, bw)
				return len(res.Owned) == 8
			}, func() string {
				return fmt.Sprintf("B never took the closed worker's buckets: it holds %v", buckets(res.Owned))
			})
		})
	})

	t.Run("WithoutSessionEvidenceAClosedWorkersBucketsWaitForTheTTL", func(t *testing.T) {
		forKindsWhere(t, withoutSessionEvidence, func(t *testing.T, kind Kind) {
			b := setup(t)
			ttl := func(c Config) Config {
				c.TTL, c.Heartbeat, c.Margin = 2*time.Second, 500*time.Millisecond, 600*time.Millisecond
				return c
			}
			a, bw := balancedPair(t, b, kind, ttl)
			// Judged by the database's clock, not by how fast this test
			// runs: a's leases (and its worker row, written at the same
			// now()) expire at expiry; a pass's now() is its grants' and
			// renewals' expiry less the TTL.
			expiry := map[int]time.Time{}
			var first time.Time // the earliest
			for _, l := range a.Held() {
				expiry[l.Slot] = l.Expires
				if first.IsZero() || l.Expires.Before(first) {
					first = l.Expires
				}
			}
			require.NoError(t, a.Stop(context.Background())) // crashed: no session to prove it
			passedAt := func(res PassResult) time.Time { return res.Owned[0].Expires.Add(-bw.cfg.TTL) }
			var res PassResult
			eventually(t, 30*time.Second, func() bool {
				res = pass(t, bw)
				now := passedAt(res)
				if now.Before(first) {
					require.Len(t, res.Owned, 4, "a live-looking owner keeps its buckets until its lease expires")
					require.Equal(t, 2, res.Live, "and counts as live")
				}
				for _, tk := range res.Takeovers {
					require.Equal(t, "a", tk.From)
					require.Equal(t, EvidenceExpired, tk.Evidence)
					require.True(t, now.After(expiry[tk.Bucket]),
						"bucket %d taken at %v, before a's lease expired at %v", tk.Bucket, now, expiry[tk.Bucket])
				}
				return len(res.Owned) == 8
			}, func() string { return fmt.Sprintf("B never took the expired buckets: it holds %v", buckets(res.Owned)) })
		})
	})

	t.Run("AWorkerThatStopsRenewingExpiresEvenIfItsSessionStaysUp", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a, bw := balancedPair(t, b, kind, shortTTL)
			_ = a // hung: its session (if it has one) stays up but it never renews
			var res PassResult
			eventually(t, 30*time.Second, func() bool {
				res = pass(t, bw)
				return len(res.Owned) == 8
			}, func() string {
				return fmt.Sprintf("a hung worker's buckets never expired: B holds %v", buckets(res.Owned))
			})
			for _, l := range bw.Held() {
				require.NoError(t, bw.EnsureHeld(l.Bucket))
			}
		})
	})

	t.Run("SessionEvidenceEnsureHeldAsksTheSessionEveryTime", func(t *testing.T) {
		forKindsWhere(t, withSessionEvidence, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 2, "a"))
			pass(t, a)
			require.NoError(t, a.EnsureHeld(0))
			a.session.close() // as if the connection dropped
			require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld)
			require.NoError(t, a.session.open(context.Background()))
			err := a.EnsureHeld(0)
			require.ErrorIs(t, err, ErrNotHeld, "a new session does not vouch for leases before a pass confirms them")
			require.Contains(t, err.Error(), "new session")
			res := pass(t, a) // nobody took anything meanwhile
			require.Empty(t, res.Lost)
			require.NoError(t, a.EnsureHeld(0))
		})
	})

	t.Run("ASessionlessKindWorksThroughATransactionPooler", func(t *testing.T) {
		forKindsWhere(t, sessionless, func(t *testing.T, kind Kind) {
			// As behind PgBouncer in transaction mode: the simple protocol (no
			// prepared statements), and a different server session for every
			// transaction (each connection is dropped after one use).
			cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			cfg.AfterRelease = func(*pgx.Conn) bool { return false }
			pooled, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			defer pooled.Close()
			b := setup(t)
			b.pool = pooled
			table := checkpointTable(t, &testBundle{pool: pgtest.Pool(t), schema: b.schema}, 4)
			open := func(w string) *Store {
				c := b.config(kind, 4, w)
				c.NoListen = true // LISTEN needs a session
				return b.open(t, c)
			}
			a := open("a")
			require.Len(t, pass(t, a).Owned, 4)
			bw := open("b")
			require.Len(t, pass(t, bw).Requested, 2)
			res := pass(t, a)
			for _, bk := range res.HandOff {
				require.NoError(t, a.HandOver(context.Background(), bk))
			}
			res = pass(t, bw)
			require.Len(t, res.Claimed, 2)
			l := res.Claimed[0]
			require.NoError(t, fencedWrite(context.Background(), pooled, table, bw.Fence(l.Bucket, l.Epoch), l.Bucket, 1, "b", l.Epoch))
			require.ErrorIs(t, fencedWrite(context.Background(), pooled, table, a.Fence(l.Bucket, 1), l.Bucket, 2, "a", 1),
				eventsource.ErrFenceLost)
			require.NoError(t, a.EnsureHeld(buckets(a.Held())[0]))
			require.NoError(t, a.Leave(context.Background()))
			require.Len(t, pass(t, bw).Owned, 4)
		})
	})
}
