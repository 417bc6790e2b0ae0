package leasestore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// operatorReset is the shape of `kumi checkpoints reset`: FenceOut, then
// the write, in one transaction.
func operatorReset(ctx context.Context, b *testBundle, table string, bucket int, position int64, force bool) (FencedOut, error) {
	var out FencedOut
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		if out, err = FenceOut(ctx, tx, b.schema, b.sub, bucket, force); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE "+table+" SET position = $2, writer = 'operator' WHERE bucket = $1", bucket, position)
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
			pgtest.Eventually(t, 10*time.Second, func() bool {
				snap, err := a.Snapshot(ctx)
				require.NoError(t, err)
				return !snap.Buckets[0].Held(snap.Now)
			}, "the lease never lapsed")

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
			require.Equal(t, []Lease{{Bucket: 0, Epoch: out.Epoch, Expires: res.Claimed[0].Expires}}, res.Claimed)
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
