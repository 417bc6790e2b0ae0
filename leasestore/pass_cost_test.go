package leasestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAPassIsOneRoundTripAndACommit: a steady pass of a balanced worker is
// one pipelined batch — BEGIN, the transaction's settings, the heartbeat
// with the subscription's read, the workers, the renew, this worker's
// claims — and a COMMIT: 7 statements in 2 round trips (was 9 in 3: BEGIN
// on its own, the settings, the protocol and the subscription's read as
// statements of their own). KindSession asks its session first (one more
// of each). During a resize the pass also re-checks the transitions under
// the subscription's row (one more of each).
func TestAPassIsOneRoundTripAndACommit(t *testing.T) {
	t.Parallel()
	for _, k := range leaseKinds {
		t.Run(k.kind.String(), func(t *testing.T) {
			t.Parallel()
			b := setupResize(t, 8)
			pool, tr := tracedPool(t, 8)
			b.pool = pool
			var stores []*Store
			for i := range 2 {
				c := b.config(k.kind, 4, fmt.Sprintf("w%d", i))
				c.NoListen = true
				stores = append(stores, b.open(t, c))
			}
			settle(t, stores, 4)
			extra := 0
			if k.features.sessionEvidence {
				extra = 1
			}
			// cost counts what one pass sent; a pass abandoned after its
			// heartbeat on a loaded machine is measured again.
			cost := func() (stmts, trips int64) {
				for range 10 {
					stmts0, trips0 := tr.stmts.Load(), tr.trips.Load()
					res, err := stores[0].Pass(context.Background())
					if errors.Is(err, context.DeadlineExceeded) {
						continue
					}
					require.NoError(t, err)
					require.Empty(t, res.Claimed)
					require.Empty(t, res.Lost)
					return tr.stmts.Load() - stmts0, tr.trips.Load() - trips0
				}
				t.Fatal("ten passes in a row were abandoned after one heartbeat")
				return 0, 0
			}
			steadyTrips := 2 + extra
			if os.Getenv("KUMI_LEASE_BATCHED") != "" {
				// Through a PassBatcher the COMMIT goes in the batch, once
				// the store's last pass was steady.
				steadyTrips--
				pass(t, stores[0])
			}
			stmts, trips := cost()
			require.Equal(t, [2]int64{int64(7 + extra), int64(steadyTrips)}, [2]int64{stmts, trips},
				"a steady pass: statements and round trips")

			b.request(t, 8)
			settle(t, stores, 12)
			stmts, trips = cost()
			require.Equal(t, [2]int64{int64(8 + extra), int64(3 + extra)}, [2]int64{stmts, trips},
				"a pass during a resize: statements and round trips")
		})
	}
}

// TestAPassLearnsOfAResizeByItself: the pass reads the subscription's
// resize in its heartbeat statement, every time: a worker that hears no
// notification (NoListen, or every NOTIFY lost) learns of a resize on its
// next pass, takes its share of the next generation, and learns of a
// cancel the same way.
func TestAPassLearnsOfAResizeByItself(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		b := setupResize(t, 6)
		c := b.config(kind, 4, "deaf")
		c.NoListen = true
		s := b.open(t, c)
		require.Len(t, pass(t, s).Owned, 4)
		require.False(t, pass(t, s).Resize.Resizing())

		b.request(t, 6)
		res := pass(t, s)
		require.Equal(t, ResizeSealing, res.Resize.State, "the next pass sees the resize: %+v", res.Resize)
		require.Equal(t, 6, res.Resize.NextBuckets)
		require.Len(t, res.Claimed, 6, "and takes the next generation's slots")
		for _, l := range res.Claimed {
			require.Equal(t, 1, l.Generation)
			require.False(t, l.Ready, "on standby until the switch")
		}

		_, err := CancelResize(context.Background(), b.pool, b.schema, b.sub)
		require.NoError(t, err)
		res = pass(t, s)
		require.Equal(t, ResizeSteady, res.Resize.State, "the next pass sees the cancel: %+v", res.Resize)
		require.Len(t, res.Owned, 4)
		require.Len(t, res.Lost, 6, "the next generation's slots are gone")
	})
}

// TestAPassAtTheFloorIsOneRoundTripAndACommit: a worker held at the floor
// below the share — 3 buckets and 2 workers: a share of 2, a floor of 1 —
// passes as a balanced one does, its first batch and a COMMIT, when its
// first batch found nothing to claim and no owner above the share to place
// a claim on (was the first batch, a claim, a placement's batch and its
// savepoint's release, every heartbeat, each in a transaction of its own:
// outside a PassBatcher's round trip). When a bucket turns claimable it
// claims it on its next pass.
func TestAPassAtTheFloorIsOneRoundTripAndACommit(t *testing.T) {
	t.Parallel()
	for _, k := range leaseKinds {
		t.Run(k.kind.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pool, tr := tracedPool(t, 8)
			b.pool = pool
			var stores []*Store
			for i := range 2 {
				c := b.config(k.kind, 3, fmt.Sprintf("w%d", i))
				c.NoListen = true
				stores = append(stores, b.open(t, c))
			}
			settle(t, stores, 3)
			floor := stores[0]
			if len(stores[1].Held()) < len(floor.Held()) {
				floor = stores[1]
			}
			require.Len(t, floor.Held(), 1, "one worker at the floor")
			extra := 0
			if k.features.sessionEvidence {
				extra = 1
			}
			trips := 2 + extra
			if os.Getenv("KUMI_LEASE_BATCHED") != "" {
				trips-- // the COMMIT in the batch, once the last pass was steady
				pass(t, floor)
			}
			for range 10 {
				stmts0, trips0 := tr.stmts.Load(), tr.trips.Load()
				res, err := floor.Pass(context.Background())
				if errors.Is(err, context.DeadlineExceeded) {
					continue // abandoned on a loaded machine: measured again
				}
				require.NoError(t, err)
				require.Len(t, res.Owned, 1)
				require.Equal(t, [2]int64{int64(7 + extra), int64(trips)},
					[2]int64{tr.stmts.Load() - stmts0, tr.trips.Load() - trips0}, "a pass at the floor: statements and round trips")
				break
			}

			// The other worker leaves: its buckets are free, and the
			// worker at the floor takes them on its next pass.
			other := stores[0]
			if other == floor {
				other = stores[1]
			}
			require.NoError(t, other.Leave(context.Background()))
			require.Len(t, pass(t, floor).Owned, 3)
		})
	}
}

// TestEnsureBucketsAfterAJoinThatFoundTheSubscriptionReadsNothing: the
// join reads the subscription in its heartbeat, and a store whose join
// found it takes its generation and bucket count from there: the
// EnsureBuckets that follows a Start (the actors runtime's, for every
// group it starts) sends nothing (was one round trip on the lease pool
// for each group a process starts). The one after it reads again.
func TestEnsureBucketsAfterAJoinThatFoundTheSubscriptionReadsNothing(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		b := setup(t)
		pool, tr := tracedPool(t, 8)
		b.pool = pool
		c := b.config(kind, 4, "first")
		c.NoListen = true
		require.NoError(t, b.open(t, c).EnsureBuckets(context.Background()))
		c = b.config(kind, 6, "second") // the database's 4 rule
		c.NoListen = true
		s := b.open(t, c)
		trips := tr.trips.Load()
		require.NoError(t, s.EnsureBuckets(context.Background()))
		require.Equal(t, trips, tr.trips.Load(), "EnsureBuckets after a join that found the subscription")
		gen, n := s.Serving()
		require.Equal(t, [2]int{0, 4}, [2]int{gen, n}, "the serving generation and its count, as the join read them")
		require.Len(t, pass(t, s).Owned, 2)
		require.NoError(t, s.EnsureBuckets(context.Background()))
		require.Greater(t, tr.trips.Load(), trips, "a second EnsureBuckets reads the subscription")
	})
}

// TestAJoinIsOneRoundTripAndACommit: a new worker's join is one batch —
// BEGIN, the settings, the heartbeat — and its notification with the
// COMMIT, in one round trip (was the notification in a round trip of its
// own). A pass that claims sends its notification with its COMMIT too.
func TestAJoinIsOneRoundTripAndACommit(t *testing.T) {
	t.Parallel()
	forKindsWhere(t, withoutSessionEvidence, func(t *testing.T, kind Kind) {
		b := setup(t)
		require.NoError(t, b.open(t, b.config(kind, 4, "first")).EnsureBuckets(context.Background()))
		pool, tr := tracedPool(t, 8)
		c := b.config(kind, 4, "second")
		c.NoListen = true
		s := openOn(t, pool, c)
		require.Equal(t, [2]int64{5, 2}, [2]int64{tr.stmts.Load(), tr.trips.Load()}, "a join: statements and round trips")

		stmts0, trips0 := tr.stmts.Load(), tr.trips.Load()
		var res PassResult
		for range 10 {
			var err error
			if res, err = s.Pass(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
				require.NoError(t, err)
				break
			}
			stmts0, trips0 = tr.stmts.Load(), tr.trips.Load() // abandoned on a loaded machine: measured again
		}
		require.Len(t, res.Claimed, 2)
		// The first batch (6), the claim, the notification and the COMMIT.
		require.Equal(t, [2]int64{9, 3}, [2]int64{tr.stmts.Load() - stmts0, tr.trips.Load() - trips0},
			"a pass that claims: statements and round trips")
	})
}

// TestAHandOverIsTwoRoundTrips: a handover is BEGIN and its statement in
// one round trip, its notification with the COMMIT in the next (was four
// round trips, one a statement: a joiner's share of 100 subscriptions was
// 100 handovers on each owner's lease pool); a release is the same.
func TestAHandOverIsTwoRoundTrips(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setup(t)
		pool, tr := tracedPool(t, 8)
		c := b.config(kind, 4, "a")
		c.NoListen = true
		a := openOn(t, pool, c)
		require.Len(t, pass(t, a).Owned, 4)
		require.Len(t, pass(t, b.open(t, b.config(kind, 4, "b"))).Requested, 2)
		res := pass(t, a)
		require.Len(t, res.HandOff, 2)

		stmts, trips := tr.stmts.Load(), tr.trips.Load()
		require.NoError(t, a.HandOver(ctx, res.HandOff[0]))
		require.Equal(t, [2]int64{4, 2}, [2]int64{tr.stmts.Load() - stmts, tr.trips.Load() - trips},
			"a handover: statements (BEGIN, the handover, the notification, COMMIT) and round trips")

		var kept int
		for _, l := range res.Owned {
			if !slices.Contains(res.HandOff, l.Slot) {
				kept = l.Slot
			}
		}
		stmts, trips = tr.stmts.Load(), tr.trips.Load()
		require.NoError(t, a.Release(ctx, []int{kept}))
		require.Equal(t, [2]int64{4, 2}, [2]int64{tr.stmts.Load() - stmts, tr.trips.Load() - trips},
			"a release: statements and round trips")
		require.ErrorIs(t, a.EnsureHeld(kept), ErrNotHeld)
	})
}
