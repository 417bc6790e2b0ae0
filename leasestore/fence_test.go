package leasestore

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// checkpointTable creates a stand-in for the event store's checkpoint table.
func checkpointTable(t *testing.T, b *testBundle, n int) string {
	t.Helper()
	table := pgx.Identifier{b.schema, "test_checkpoints"}.Sanitize()
	_, err := b.pool.Exec(context.Background(), "CREATE TABLE "+table+
		" (bucket int PRIMARY KEY, position bigint NOT NULL, writer text NOT NULL, epoch bigint NOT NULL);"+
		" INSERT INTO "+table+" SELECT g, 0, '', 0 FROM generate_series(0, "+strconv.Itoa(n-1)+") g")
	require.NoError(t, err)
	return table
}

// fencedWrite is the shape of the event store's fenced checkpoint write:
// check the fence inside the transaction, then write.
func fencedWrite(ctx context.Context, pool *pgxpool.Pool, table string, fence eventsource.Fence,
	bucket int, position int64, writer string, epoch int64) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fence.Check(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE "+table+
			" SET position = GREATEST(position, $2), writer = $3, epoch = $4 WHERE bucket = $1",
			bucket, position, writer, epoch)
		return err
	})
}

func readCheckpoint(t *testing.T, b *testBundle, table string, bucket int) (position int64, writer string) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT position, writer FROM "+table+" WHERE bucket = $1", bucket).Scan(&position, &writer))
	return position, writer
}

func TestFence(t *testing.T) {
	t.Parallel()

	t.Run("AZombiesFencedWriteChangesNothingAndTellsItThatItLost", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			table := checkpointTable(t, b, 1)
			ctx := context.Background()
			a := b.open(t, shortTTL(b.config(kind, 1, "a")))
			granted := pass(t, a).Claimed[0]
			require.EqualValues(t, 1, granted.Epoch)
			require.NoError(t, fencedWrite(ctx, b.pool, table, a.Fence(0, granted.Epoch), 0, 10, "a", granted.Epoch))

			// A pauses past its TTL; B takes the bucket over.
			bw := b.open(t, shortTTL(b.config(kind, 1, "b")))
			var res PassResult
			eventually(t, 30*time.Second, func() bool {
				res = pass(t, bw)
				return len(res.Claimed) == 1
			}, func() string { return fmt.Sprintf("B never took over: its last pass %+v", res) })
			require.EqualValues(t, 2, res.Claimed[0].Epoch)

			// A wakes up and writes as if nothing happened.
			err := fencedWrite(ctx, b.pool, table, a.Fence(0, granted.Epoch), 0, 20, "a", granted.Epoch)
			require.ErrorIs(t, err, eventsource.ErrFenceLost)
			var lost *LostFenceError
			require.ErrorAs(t, err, &lost)
			require.Equal(t, LostFenceError{Subscription: "orders", Bucket: 0, Worker: "a", Epoch: 1, Owner: "b", FoundEpoch: 2},
				*lost)
			require.Contains(t, err.Error(), `owner "b" at epoch 2`)
			pos, writer := readCheckpoint(t, b, table, 0)
			require.EqualValues(t, 10, pos, "the zombie's write changed nothing")
			require.Equal(t, "a", writer)
			require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld, "and A knows it lost the bucket")
			require.Equal(t, []int{0}, pass(t, a).Lost)

			require.NoError(t, fencedWrite(ctx, b.pool, table, bw.Fence(0, 2), 0, 30, "b", 2))
			pos, writer = readCheckpoint(t, b, table, 0)
			require.EqualValues(t, 30, pos)
			require.Equal(t, "b", writer)
		})
	})

	t.Run("GuardChecksOwnerAndEpochInTheCallersTransaction", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			ctx := context.Background()
			a := b.open(t, b.config(kind, 2, "a"))
			pass(t, a)
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			require.NoError(t, a.Guard(ctx, tx, 1, 1))
			var lost *LostFenceError
			require.ErrorAs(t, a.Guard(ctx, tx, 1, 7), &lost, "a wrong epoch")
			require.EqualValues(t, 1, lost.FoundEpoch)
			require.ErrorAs(t, a.Guard(ctx, tx, 99, 1), &lost, "no such bucket")
			require.EqualValues(t, -1, lost.FoundEpoch)
			require.Contains(t, lost.Error(), "no lease row")
			other := b.open(t, b.config(kind, 2, "other"))
			require.ErrorAs(t, other.Guard(ctx, tx, 0, 1), &lost, "another worker's bucket")
			require.Equal(t, "a", lost.Owner)
		})
	})

	t.Run("AWriteUnderALapsedLeaseThatNobodyTookStillLands", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			table := checkpointTable(t, b, 1)
			a := b.open(t, shortTTL(b.config(kind, 1, "a")))
			pass(t, a)
			var snap Snapshot
			eventually(t, 30*time.Second, func() bool {
				var err error
				snap, err = a.Snapshot(context.Background())
				require.NoError(t, err)
				return !snap.Buckets[0].Held(snap.Now)
			}, func() string { return fmt.Sprintf("the lease never lapsed: %+v at %v", snap.Buckets[0], snap.Now) })
			require.NoError(t, fencedWrite(context.Background(), b.pool, table, a.Fence(0, 1), 0, 5, "a", 1),
				"the fence is owner and epoch: nobody else can have written")
			require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld, "but EnsureHeld, for effects outside the database, refuses")
		})
	})

	t.Run("AFencedWriteStuckPastTheTTLIsEndedByTheServerAndTheTakeoverProceeds", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			ctx := context.Background()
			a := b.open(t, shortTTL(b.config(kind, 1, "a")))
			pass(t, a)
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			require.NoError(t, a.Guard(ctx, tx, 0, 1)) // FOR SHARE until tx ends: a frozen writer
			bw := b.open(t, shortTTL(b.config(kind, 1, "b")))
			// Without a bound, the frozen writer's row lock would keep every
			// SKIP LOCKED claim off the bucket for as long as it stays frozen.
			var res PassResult
			eventually(t, 30*time.Second, func() bool { res = pass(t, bw); return len(res.Claimed) == 1 },
				func() string {
					return fmt.Sprintf("the server ends the idle transaction a TTL later, and b takes the expired bucket: "+
						"b's last pass %+v", res)
				})
			require.Error(t, tx.Commit(ctx), "the frozen writer's transaction was ended: its write cannot land")
		})
	})
}
