package leasestore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// operatorReset is the shape of `kumi checkpoints reset`: OperatorFence
// (FenceOut with a lock timeout), then the write, in one transaction.
func operatorReset(ctx context.Context, b *testBundle, table string, bucket int, position int64, force bool) (FencedOut, error) {
	var out FencedOut
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := OperatorFence(b.schema, b.sub, bucket, force, &out).Check(ctx, tx); err != nil {
			return err
		}
		var timeout string
		if err := tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&timeout); err != nil || timeout != "5s" {
			return fmt.Errorf("lock_timeout %q (%v): the fence must bound its wait for the row", timeout, err)
		}
		_, err := tx.Exec(ctx, "UPDATE "+table+" SET position = $2, writer = 'operator' WHERE bucket = $1", bucket, position)
		return err
	})
	return out, err
}

func TestFenceOut(t *testing.T) {
	t.Parallel()

	t.Run("AResetOnALapsedButUnclaimedLeaseIsNotUndoneWhenItsOwnerComesBack", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			ctx := context.Background()
			b := setup(t)
			table := checkpointTable(t, b, 1)
			a := b.open(t, shortTTL(b.config(kind, 1, "a")))
			l := pass(t, a).Claimed[0]
			require.NoError(t, fencedWrite(ctx, b.pool, table, a.Fence(0, l.Epoch), 0, 20, "a", l.Epoch))

			// a's passes stop; its lease lapses; nobody claims it.
			var snap Snapshot
			eventually(t, 30*time.Second, func() bool {
				var err error
				snap, err = a.Snapshot(ctx)
				require.NoError(t, err)
				return !snap.Buckets[0].Held(snap.Now)
			}, func() string { return fmt.Sprintf("the lease never lapsed: %+v at %v", snap.Buckets[0], snap.Now) })

			out, err := operatorReset(ctx, b, table, 0, 5, false)
			require.NoError(t, err, "a lapsed lease does not refuse the reset")
			require.True(t, out.Found)
			require.False(t, out.Live)
			require.Equal(t, "a", out.Owner)
			require.Greater(t, out.Epoch, l.Epoch, "every earlier holding is fenced out")

			// a comes back: its in-memory cursor (30) must not land.
			err = fencedWrite(ctx, b.pool, table, a.Fence(0, l.Epoch), 0, 30, "a", l.Epoch)
			require.ErrorIs(t, err, eventsource.ErrFenceLost, "the old holding's write is fenced out")
			pos, writer := readCheckpoint(t, b, table, 0)
			require.EqualValues(t, 5, pos)
			require.Equal(t, "operator", writer)
			require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld)

			// Its next pass renews at the new epoch: lost at the old one,
			// claimed at the new one, so its reader restarts from the
			// stored checkpoint.
			res := pass(t, a)
			require.Equal(t, []int{0}, res.Lost)
			require.Equal(t, []Lease{{Bucket: 0, Slot: 0, Buckets: 1, Ready: true, Epoch: out.Epoch, Expires: res.Claimed[0].Expires}}, res.Claimed)
			require.NoError(t, fencedWrite(ctx, b.pool, table, a.Fence(0, out.Epoch), 0, 6, "a", out.Epoch))
			pos, _ = readCheckpoint(t, b, table, 0)
			require.EqualValues(t, 6, pos)
		})
	})

	t.Run("ALiveOwnerRefusesUnlessForcedAndForcedIsFencedOutToo", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			ctx := context.Background()
			b := setup(t)
			table := checkpointTable(t, b, 2)
			a := b.open(t, b.config(kind, 2, "a"))
			l := pass(t, a).Claimed[0]
			require.NoError(t, fencedWrite(ctx, b.pool, table, a.Fence(0, l.Epoch), 0, 20, "a", l.Epoch))

			_, err := operatorReset(ctx, b, table, 0, 5, false)
			var held *HeldError
			require.ErrorAs(t, err, &held)
			require.Equal(t, "a", held.Owner)
			require.Equal(t, l.Epoch, held.Epoch)
			require.Positive(t, held.ExpiresIn)
			pos, _ := readCheckpoint(t, b, table, 0)
			require.EqualValues(t, 20, pos, "refused: nothing written")
			snap, err := a.Snapshot(ctx)
			require.NoError(t, err)
			require.Equal(t, l.Epoch, snap.Buckets[0].Epoch, "refused: the epoch is unchanged")

			out, err := operatorReset(ctx, b, table, 0, 5, true)
			require.NoError(t, err)
			require.True(t, out.Live)
			require.Equal(t, l.Epoch+1, out.Epoch)
			require.ErrorIs(t, fencedWrite(ctx, b.pool, table, a.Fence(0, l.Epoch), 0, 30, "a", l.Epoch),
				eventsource.ErrFenceLost)
			pos, _ = readCheckpoint(t, b, table, 0)
			require.EqualValues(t, 5, pos)
			res := pass(t, a)
			require.Equal(t, []int{0}, res.Lost)
			require.Equal(t, []int{0}, buckets(res.Claimed), "the owner keeps the bucket, at the new epoch")
			require.Len(t, res.Owned, 2)
		})
	})

	t.Run("NoLeaseRowIsNotAnError", func(t *testing.T) {
		b := setup(t)
		err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
			out, err := FenceOut(context.Background(), tx, b.schema, b.sub, 3, false)
			require.False(t, out.Found)
			return err
		})
		require.NoError(t, err)
	})
}

// refusedFor asserts a *HandoffError with reason.
func refusedFor(t *testing.T, err error, reason error) *HandoffError {
	t.Helper()
	var refused *HandoffError
	require.ErrorAs(t, err, &refused)
	require.ErrorIs(t, err, reason, "%v", err)
	return refused
}

func TestRequestHandoff(t *testing.T) {
	t.Parallel()

	t.Run("TheLeastLoadedClaimsTheOwnerHandsOverTheClaimantActivates", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			ctx := context.Background()
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a"))
			require.Len(t, pass(t, a).Owned, 4, "alone, a takes every bucket")
			bw := b.open(t, b.config(kind, 4, "b")) // workers that have run no pass
			c := b.open(t, b.config(kind, 4, "c"))
			conn, err := b.pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{ChannelName(b.schema, b.sub)}.Sanitize())
			require.NoError(t, err)

			req, err := RequestHandoff(ctx, b.pool, b.schema, b.sub, 0, "")
			require.NoError(t, err)
			require.Equal(t, "a", req.Owner)
			require.Equal(t, "b", req.To, "b and c hold nothing: the first by name")
			require.Equal(t, [3]int{4, 3, 0}, [3]int{req.Buckets, req.Live, req.Load})
			require.Empty(t, req.Before.Buckets[0].ClaimWorker, "Before is the state before the claim")
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			for { // the workers' own notifications may come first
				n, err := conn.Conn().WaitForNotification(wctx)
				require.NoError(t, err, "the workers are never woken")
				if n.Payload == "request:kumi-operator" {
					break
				}
			}
			cancel()

			req1, err := RequestHandoff(ctx, b.pool, b.schema, b.sub, 1, "")
			require.NoError(t, err)
			require.Equal(t, "c", req1.To, "b's pending claim counts in its load")
			_, err = RequestHandoff(ctx, b.pool, b.schema, b.sub, 2, "b")
			require.NoError(t, err)
			req3, err := RequestHandoff(ctx, b.pool, b.schema, b.sub, 3, "b")
			require.NoError(t, err)
			require.Equal(t, 2, req3.Load, "b's two claims: above its share of 2 once this one lands")

			res := pass(t, a)
			require.Equal(t, []int{0, 1, 2, 3}, res.HandOff, "the owner sees every claim")
			for bk := range 4 {
				require.NoError(t, a.HandOver(ctx, bk))
			}
			claimed := pass(t, bw).Claimed
			require.True(t, slices.ContainsFunc(claimed, func(l Lease) bool { return l.Bucket == 0 && l.Epoch == req.Epoch+1 }),
				"b activates bucket 0 at the next epoch: %+v", claimed)
			owner, _ := ownership(t, c)
			require.Equal(t, "b", owner[0])
			require.Contains(t, buckets(pass(t, c).Claimed), 1)
		})
	})

	t.Run("RefusesWhatCannotBeHandedOverAndChangesNothing", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			ctx := context.Background()
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a"))
			pass(t, a)
			request := func(sub string, bucket int, to string) error {
				_, err := RequestHandoff(ctx, b.pool, b.schema, sub, bucket, to)
				return err
			}

			e := refusedFor(t, request(b.sub, 2, ""), ErrNoOtherWorker)
			require.Equal(t, "a", e.Lease.Owner)
			require.Contains(t, e.Error(), "a is the only live worker")

			b.open(t, b.config(kind, 4, "b"))
			require.NoError(t, a.Release(ctx, []int{3}))
			before, err := a.Snapshot(ctx)
			require.NoError(t, err)

			require.Zero(t, refusedFor(t, request("nosuch", 0, ""), ErrNoBuckets).Buckets)
			require.Equal(t, 4, refusedFor(t, request(b.sub, 4, ""), ErrBucketOutOfRange).Buckets)
			refusedFor(t, request(b.sub, -1, ""), ErrBucketOutOfRange)
			refusedFor(t, request(b.sub, 3, ""), ErrBucketFree)
			require.Equal(t, "a", refusedFor(t, request(b.sub, 2, "a"), ErrTargetIsOwner).To)
			refusedFor(t, request(b.sub, 2, "ghost"), ErrTargetNotLive)
			after, err := a.Snapshot(ctx)
			require.NoError(t, err)
			require.Equal(t, before.Buckets, after.Buckets, "no refusal changed a lease row")

			_, err = RequestHandoff(ctx, b.pool, b.schema, b.sub, 2, "b")
			require.NoError(t, err)
			e = refusedFor(t, request(b.sub, 2, ""), ErrClaimPending)
			require.Equal(t, "b", e.Lease.ClaimWorker)
			require.Equal(t, "a", e.Lease.Owner)
		})
	})

	t.Run("RefusesAnExpiredLease", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			ctx := context.Background()
			b := setup(t)
			a := b.open(t, shortTTL(b.config(kind, 2, "a")))
			pass(t, a)
			b.open(t, b.config(kind, 2, "b")) // live for 30 s
			var snap Snapshot
			eventually(t, 30*time.Second, func() bool {
				var err error
				snap, err = a.Snapshot(ctx)
				require.NoError(t, err)
				return !snap.Buckets[0].Held(snap.Now)
			}, func() string { return fmt.Sprintf("a's lease never lapsed: %+v at %v", snap.Buckets[0], snap.Now) })
			_, err := RequestHandoff(ctx, b.pool, b.schema, b.sub, 0, "b")
			e := refusedFor(t, err, ErrLeaseExpired)
			require.Equal(t, "a", e.Lease.Owner)
			require.True(t, e.Now.After(e.Lease.Expires))
		})
	})

	// The decision is made on an unlocked read; the claim re-checks it
	// under the row lock. A claim committed in between refuses the
	// request instead of being overwritten.
	t.Run("AClaimPlacedMeanwhileIsNotOverwritten", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			ctx := context.Background()
			b := setup(t)
			a := b.open(t, b.config(kind, 2, "a"))
			pass(t, a)
			b.open(t, b.config(kind, 2, "b"))
			b.open(t, b.config(kind, 2, "c"))

			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			var pid int
			require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
			_, err = tx.Exec(ctx, "UPDATE "+pgx.Identifier{b.schema}.Sanitize()+
				".lease_buckets SET claim_worker = 'c', claimed_at = now() WHERE subscription = $1 AND bucket = 0", b.sub)
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() {
				_, err := RequestHandoff(ctx, b.pool, b.schema, b.sub, 0, "b")
				done <- err
			}()
			pgtest.Eventually(t, 30*time.Second, func() bool {
				var waiting bool
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE $1::int = ANY (pg_blocking_pids(pid)))`, pid).Scan(&waiting))
				return waiting
			}, "the request never waited for the row")
			require.NoError(t, tx.Commit(ctx))
			e := refusedFor(t, <-done, ErrHandoffRaced)
			require.Equal(t, "b", e.To)
			snap, err := a.Snapshot(ctx)
			require.NoError(t, err)
			require.Equal(t, "c", snap.Buckets[0].ClaimWorker)
		})
	})

	t.Run("NeedsASchema", func(t *testing.T) {
		_, err := RequestHandoff(context.Background(), nil, "", "orders", 0, "")
		var cfg *kumierr.ConfigError
		require.ErrorAs(t, err, &cfg)
		require.Equal(t, "leasestore schema", cfg.Field)
	})
}
