package leasestore

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// split checks every bucket's owner by the database's clock: whether every
// bucket is held, and the smallest and largest holdings over workers.
func split(t *testing.T, s *Store, workers []*Store) (allOwned bool, unowned map[int]bool, lo, hi int) {
	t.Helper()
	owner, per := ownership(t, s)
	unowned = map[int]bool{}
	for b := range s.cfg.Buckets {
		if owner[b] == "" {
			unowned[b] = true
		}
	}
	lo, hi = s.cfg.Buckets, 0
	for _, w := range workers {
		n := len(per[w.Worker()])
		lo, hi = min(lo, n), max(hi, n)
	}
	return len(unowned) == 0, unowned, lo, hi
}

func TestConvergence(t *testing.T) {
	t.Parallel()

	t.Run("WorkersStartedTogetherReachAFairSplitWithinThreePasses", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			for _, tc := range []struct{ k, n int }{{2, 8}, {3, 10}, {8, 64}, {32, 1024}} {
				t.Run(fmt.Sprintf("%dWorkers%dBuckets", tc.k, tc.n), func(t *testing.T) {
					t.Parallel()
					b := setup(t)
					b.pool = pgtest.NewPool(t, 12)
					workers := make([]*Store, tc.k)
					for i := range workers {
						c := b.config(kind, tc.n, fmt.Sprintf("w%02d", i))
						c.NoListen = true
						workers[i] = b.open(t, c)
					}
					require.NoError(t, workers[0].EnsureBuckets(t.Context()))
					ceil, floor := FairShare(tc.n, tc.k), tc.n/tc.k
					fair := -1
					for r := 1; r <= 8; r++ {
						res := round(t, workers)
						for _, p := range res {
							require.Equal(t, tc.k, p.Live, "a worker row makes every worker visible at once")
						}
						all, _, lo, hi := split(t, workers[0], workers)
						if fair < 0 && all && hi <= ceil {
							fair = r
						}
						if fair > 0 && lo >= floor {
							t.Logf("fair (all owned, none above %d) after %d pass(es); everyone within [%d, %d] after %d",
								ceil, fair, floor, ceil, r)
							break
						}
						require.Less(t, r, 8, "never balanced: lo %d hi %d", lo, hi)
					}
					require.Positive(t, fair)
					require.LessOrEqual(t, fair, 3, "every bucket owned and nobody above ceil(N/k) within 3 passes")
				})
			}
		})
	})

	t.Run("WorkersJoiningOneThatTookEverythingGetTheirSharesWithinThreePasses", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			first := b.open(t, b.config(kind, 64, "first"))
			require.Len(t, pass(t, first).Owned, 64, "alone, it takes everything")
			workers := []*Store{first}
			for i := range 7 {
				workers = append(workers, b.open(t, b.config(kind, 64, fmt.Sprintf("late%d", i))))
			}
			for r := 1; ; r++ {
				for i, res := range round(t, workers) {
					t.Logf("round %d %s: owned %d claimed %d handoff %d pending %d requested %d live %d",
						r, workers[i].Worker(), len(res.Owned), len(res.Claimed), len(res.HandOff), len(res.Pending),
						len(res.Requested), res.Live)
				}
				all, _, lo, hi := split(t, first, workers)
				if all && lo == 8 && hi == 8 {
					t.Logf("7 joiners had their shares after %d passes", r)
					break
				}
				require.Less(t, r, 3, "not balanced after %d passes: lo %d hi %d", r, lo, hi)
			}
		})
	})

	t.Run("AWorkerJoiningABalancedPoolGetsItsShareThroughHandoff", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			var workers []*Store
			for i := range 3 {
				workers = append(workers, b.open(t, b.config(kind, 12, fmt.Sprintf("w%d", i))))
			}
			round(t, workers)
			all, _, lo, hi := split(t, workers[0], workers)
			require.True(t, all)
			require.Equal(t, 4, lo)
			require.Equal(t, 4, hi)

			joiner := b.open(t, b.config(kind, 12, "joiner"))
			workers = append(workers, joiner)
			unownedBefore := map[int]bool{}
			for r := 1; ; r++ {
				round(t, workers)
				_, unowned, lo, hi := split(t, workers[0], workers)
				for bk := range unowned {
					require.False(t, unownedBefore[bk], "bucket %d unowned for two passes in a row", bk)
				}
				unownedBefore = unowned
				if lo == 3 && hi == 3 && len(unowned) == 0 {
					t.Logf("the joiner has its share after %d passes", r)
					require.LessOrEqual(t, r, 3, "claim, hand over, activate")
					break
				}
				require.Less(t, r, 3, "not balanced after %d passes: lo %d hi %d", r, lo, hi)
			}
			require.Len(t, joiner.Held(), 3)
		})
	})
}
