package eventsource_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// epochFence is the shape of the lease store's fence: the write lands only
// while the lease row still names this owner at the granted epoch. The
// lease table here is the test's own.
func epochFence(s *eventsource.Store, bucket int, owner string, epoch int64) eventsource.Fence {
	return eventsource.FenceFunc(func(ctx context.Context, tx pgx.Tx) error {
		var curOwner string
		var curEpoch int64
		err := tx.QueryRow(ctx, "SELECT owner, epoch FROM "+s.QuotedSchema()+".test_leases WHERE bucket = $1 FOR SHARE",
			bucket).Scan(&curOwner, &curEpoch)
		if err != nil {
			return err
		}
		if curOwner != owner || curEpoch != epoch {
			return fmt.Errorf("%w: bucket %d is held by %s at epoch %d, not %s at %d",
				eventsource.ErrFenceLost, bucket, curOwner, curEpoch, owner, epoch)
		}
		return nil
	})
}

// newStoreWithHead returns a new store whose head is n (one append of n
// events, sequenced): a checkpoint is written only at or below the head.
func newStoreWithHead(t *testing.T, n int) *eventsource.Store {
	t.Helper()
	s := newStore(t)
	events := make([]eventsource.EventData, n)
	for i := range events {
		events[i] = ev("Filled", `{}`)
	}
	mustAppend(t, s, "filler-1", events...)
	sequenceAll(t, s)
	require.EqualValues(t, n, head(t, s))
	return s
}

func TestCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("NeverMovesBackwards", func(t *testing.T) {
		t.Parallel()
		s := newStoreWithHead(t, 20)
		p, err := s.Checkpoint(ctx, "sub", 0)
		require.NoError(t, err)
		require.Zero(t, p, "no checkpoint reads as 0")

		for _, c := range []struct{ save, want int64 }{{10, 10}, {5, 10}, {10, 10}, {0, 10}, {20, 20}, {19, 20}} {
			stored, err := s.SaveCheckpoint(ctx, "sub", 0, c.save, nil)
			require.NoError(t, err)
			require.Equal(t, c.want, stored, "save %d", c.save)
			p, err := s.Checkpoint(ctx, "sub", 0)
			require.NoError(t, err)
			require.Equal(t, c.want, p)
		}
		p, err = s.Checkpoint(ctx, "sub", 1)
		require.NoError(t, err)
		require.Zero(t, p, "buckets are independent")
	})

	t.Run("ConcurrentSavesKeepTheHighest", func(t *testing.T) {
		t.Parallel()
		s := newStoreWithHead(t, 1000)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var highest int64
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 25 {
					p := rand.Int64N(1001)
					mu.Lock()
					highest = max(highest, p)
					mu.Unlock()
					_, err := s.SaveCheckpoint(ctx, "sub", 3, p, nil)
					if !assertNoError(t, err) {
						return
					}
				}
			}()
		}
		wg.Wait()
		p, err := s.Checkpoint(ctx, "sub", 3)
		require.NoError(t, err)
		require.Equal(t, highest, p)
	})

	t.Run("RefusingFenceChangesNothingAndReturnsItsError", func(t *testing.T) {
		t.Parallel()
		s := newStoreWithHead(t, 600)
		_, err := s.Pool().Exec(ctx, "CREATE TABLE "+s.QuotedSchema()+".test_leases (bucket int PRIMARY KEY, owner text, epoch bigint)")
		require.NoError(t, err)
		_, err = s.Pool().Exec(ctx, "INSERT INTO "+s.QuotedSchema()+".test_leases VALUES (0, 'w1', 1), (1, 'w1', 1)")
		require.NoError(t, err)

		stored, err := s.SaveCheckpoint(ctx, "sub", 0, 100, epochFence(s, 0, "w1", 1))
		require.NoError(t, err)
		require.Equal(t, int64(100), stored)

		// w2 takes the bucket: epoch 2. w1 is now a zombie.
		_, err = s.Pool().Exec(ctx, "UPDATE "+s.QuotedSchema()+".test_leases SET owner = 'w2', epoch = 2 WHERE bucket = 0")
		require.NoError(t, err)
		_, err = s.SaveCheckpoint(ctx, "sub", 0, 500, epochFence(s, 0, "w1", 1))
		require.ErrorIs(t, err, eventsource.ErrFenceLost)
		require.Contains(t, err.Error(), "held by w2 at epoch 2")
		p, err := s.Checkpoint(ctx, "sub", 0)
		require.NoError(t, err)
		require.Equal(t, int64(100), p, "the zombie's write did not land")

		// A fence's own error, whatever it is, comes back unchanged.
		sentinel := errors.New("lease store unreachable")
		_, err = s.SaveCheckpoint(ctx, "sub", 1, 7, eventsource.FenceFunc(func(context.Context, pgx.Tx) error { return sentinel }))
		require.ErrorIs(t, err, sentinel)
		cps, err := s.Checkpoints(ctx, "sub")
		require.NoError(t, err)
		require.Len(t, cps, 1, "a refused first write leaves no row")
		require.Equal(t, 0, cps[0].Bucket)

		stored, err = s.SaveCheckpoint(ctx, "sub", 0, 600, epochFence(s, 0, "w2", 2))
		require.NoError(t, err)
		require.Equal(t, int64(600), stored)
	})

	t.Run("SaveCheckpointTxLandsWithTheCallersTransaction", func(t *testing.T) {
		t.Parallel()
		s := newStoreWithHead(t, 42)
		tx, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		stored, err := s.SaveCheckpointTx(ctx, tx, "sub", 2, 42, nil)
		require.NoError(t, err)
		require.Equal(t, int64(42), stored)
		require.NoError(t, tx.Rollback(ctx))
		p, err := s.Checkpoint(ctx, "sub", 2)
		require.NoError(t, err)
		require.Zero(t, p)

		require.NoError(t, pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			if _, err := s.AppendTx(ctx, tx, "projection-1", eventsource.Any, []eventsource.EventData{ev("Projected", `{}`)}); err != nil {
				return err
			}
			_, err := s.SaveCheckpointTx(ctx, tx, "sub", 2, 42, nil)
			return err
		}))
		p, err = s.Checkpoint(ctx, "sub", 2)
		require.NoError(t, err)
		require.Equal(t, int64(42), p)
	})

	t.Run("ResetMovesBackwardsUnderItsFence", func(t *testing.T) {
		t.Parallel()
		s := newStoreWithHead(t, 90)
		_, err := s.SaveCheckpoint(ctx, "sub", 0, 90, nil)
		require.NoError(t, err)
		refuse := eventsource.FenceFunc(func(context.Context, pgx.Tx) error { return eventsource.ErrFenceLost })
		require.ErrorIs(t, s.ResetCheckpoint(ctx, "sub", 0, 10, refuse), eventsource.ErrFenceLost)
		p, err := s.Checkpoint(ctx, "sub", 0)
		require.NoError(t, err)
		require.Equal(t, int64(90), p)
		require.NoError(t, s.ResetCheckpoint(ctx, "sub", 0, 10, nil))
		p, err = s.Checkpoint(ctx, "sub", 0)
		require.NoError(t, err)
		require.Equal(t, int64(10), p)
	})

	t.Run("CheckpointsListsBuckets", func(t *testing.T) {
		t.Parallel()
		s := newStoreWithHead(t, 30)
		for b := 3; b >= 0; b-- {
			_, err := s.SaveCheckpoint(ctx, "listed", b, int64(b*10), nil)
			require.NoError(t, err)
		}
		_, err := s.SaveCheckpoint(ctx, "other", 0, 1, nil)
		require.NoError(t, err)
		cps, err := s.Checkpoints(ctx, "listed")
		require.NoError(t, err)
		require.Len(t, cps, 4)
		for i, c := range cps {
			require.Equal(t, i, c.Bucket)
			require.Equal(t, int64(i*10), c.Position)
			require.False(t, c.UpdatedAt.IsZero())
		}
	})

	// A checkpoint above the head names a position this server never
	// handed out (one read before a failover: see TestFailover): the
	// write is refused in its own statement, fenced or not, and nothing
	// is written.
	t.Run("AboveTheHeadIsRefused", func(t *testing.T) {
		t.Parallel()
		s := newStoreWithHead(t, 5)
		_, err := s.SaveCheckpoint(ctx, "sub", 0, 6, nil)
		var above *eventsource.CheckpointAboveHeadError
		require.ErrorAs(t, err, &above)
		require.ErrorIs(t, err, eventsource.ErrCheckpointAboveHead)
		require.Equal(t, eventsource.CheckpointAboveHeadError{Subscription: "sub", Bucket: 0, Position: 6, Head: 5}, *above)
		require.Equal(t, 0, countRows(t, s, "checkpoints"), "a refused first write leaves no row")

		stored, err := s.SaveCheckpoint(ctx, "sub", 0, 5, nil)
		require.NoError(t, err)
		require.EqualValues(t, 5, stored, "the head itself is a checkpoint")

		fenced := eventsource.FenceFunc(func(context.Context, pgx.Tx) error { return nil })
		require.NoError(t, pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			_, err := s.SaveCheckpointTx(ctx, tx, "sub", 0, 40, fenced)
			require.ErrorIs(t, err, eventsource.ErrCheckpointAboveHead, "in the caller's transaction too")
			return nil
		}))
		p, err := s.Checkpoint(ctx, "sub", 0)
		require.NoError(t, err)
		require.EqualValues(t, 5, p)
	})

	t.Run("BadInputIsRefused", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		_, err := s.SaveCheckpoint(ctx, "", 0, 1, nil)
		require.ErrorIs(t, err, eventsource.ErrInvalidName)
		_, err = s.SaveCheckpoint(ctx, "bad\x00sub", 0, 1, nil)
		require.ErrorIs(t, err, eventsource.ErrInvalidName)
		_, err = s.SaveCheckpoint(ctx, "sub", -1, 1, nil)
		require.Error(t, err)
		_, err = s.SaveCheckpoint(ctx, "sub", 0, -1, nil)
		require.Error(t, err)
		require.ErrorIs(t, s.ResetCheckpoint(ctx, "sub", -1, 0, nil), eventsource.ErrInvalidCheckpoint)
		_, err = s.Checkpoint(ctx, "bad\nsub", 0)
		require.ErrorIs(t, err, eventsource.ErrInvalidName)
		require.Equal(t, 0, countRows(t, s, "checkpoints"))
	})
}
