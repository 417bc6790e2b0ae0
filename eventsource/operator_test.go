package eventsource_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestOperatorReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupDeadLetters(t, 5)
	s := b.s

	_, err := s.SaveCheckpoint(ctx, "billing", 0, 3, nil)
	require.NoError(t, err)
	_, err = s.SaveCheckpoint(ctx, "billing", 2, 5, nil)
	require.NoError(t, err)
	b.add(t, "billing", b.events[1], 1, "declined")
	b.add(t, "shipping", b.events[2], 0, "no address")
	replayed := b.add(t, "shipping", b.events[3], 0, "no address")
	_, err = s.ReplayDeadLetters(ctx, "shipping", eventsource.DeadLetterFilter{After: replayed.Position - 1},
		func(context.Context, eventsource.RecordedEvent) error { return nil })
	require.NoError(t, err)

	t.Run("ProgressIsTheHeadAndTheCheckpointsAtTheTransactionsClock", func(t *testing.T) {
		var p eventsource.Progress
		err := pgx.BeginTxFunc(ctx, s.Pool(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
			func(tx pgx.Tx) error {
				var err error
				p, err = s.ProgressTx(ctx, tx, "billing")
				if err != nil {
					return err
				}
				var now time.Time
				require.NoError(t, tx.QueryRow(ctx, "SELECT now()").Scan(&now))
				require.True(t, now.Equal(p.Now), "Now is the transaction's clock")
				return nil
			})
		require.NoError(t, err)
		require.EqualValues(t, 5, p.Head)
		require.Len(t, p.Checkpoints, 2)
		require.Equal(t, 0, p.Checkpoints[0].Bucket)
		require.EqualValues(t, 3, p.Checkpoints[0].Position)
		require.Equal(t, 2, p.Checkpoints[1].Bucket)
		require.EqualValues(t, 5, p.Checkpoints[1].Position)
		require.False(t, p.Checkpoints[1].UpdatedAt.IsZero())

		err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			_, err := s.ProgressTx(ctx, tx, "")
			return err
		})
		require.ErrorIs(t, err, eventsource.ErrInvalidName)
	})

	t.Run("SubscriptionsAreThoseWithCheckpointsOrDeadLetters", func(t *testing.T) {
		want := []eventsource.SubscriptionStats{
			{Subscription: "billing", Checkpoints: 2, DeadLetters: 1},
			{Subscription: "shipping", Checkpoints: 0, DeadLetters: 1}, // one replayed
		}
		got, err := s.Subscriptions(ctx)
		require.NoError(t, err)
		require.Equal(t, want, got)
		err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			got, err = s.SubscriptionsTx(ctx, tx)
			return err
		})
		require.NoError(t, err)
		require.Equal(t, want, got)
	})

	t.Run("CountCategoryCountsSequencedAndNot", func(t *testing.T) {
		mustAppend(t, s, "order-9", ev("Placed", `{}`)) // not sequenced
		mustAppend(t, s, "other-1", ev("Placed", `{}`))
		err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			n, err := s.CountCategoryTx(ctx, tx, "order")
			require.NoError(t, err)
			require.EqualValues(t, 6, n)
			_, err = s.CountCategoryTx(ctx, tx, "no-dash")
			require.ErrorIs(t, err, eventsource.ErrInvalidName)
			return nil
		})
		require.NoError(t, err)
	})

	t.Run("KnowsSubscription", func(t *testing.T) {
		for sub, want := range map[string]bool{"billing": true, "shipping": true, "unknown": false} {
			known, err := s.KnowsSubscription(ctx, sub)
			require.NoError(t, err)
			require.Equal(t, want, known, sub)
		}
		_, err := s.KnowsSubscription(ctx, "")
		require.ErrorIs(t, err, eventsource.ErrInvalidName)
	})
}

// LockCheckpointTx serialises two transactions on one checkpoint: the
// second waits for the first and then reads its committed position.
func TestLockCheckpointTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStoreWithHead(t, 7)

	first, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = first.Rollback(ctx) }()
	p, err := s.LockCheckpointTx(ctx, first, "billing", 3)
	require.NoError(t, err)
	require.Zero(t, p, "a missing checkpoint is created at 0")
	var pid int
	require.NoError(t, first.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))

	type result struct {
		pos int64
		err error
	}
	second := make(chan result, 1)
	go func() {
		var r result
		r.err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			var err error
			r.pos, err = s.LockCheckpointTx(ctx, tx, "billing", 3)
			return err
		})
		second <- r
	}()
	pgtest.Eventually(t, 30*time.Second, func() bool {
		var waiting bool
		err := s.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE NOT granted AND $1 = ANY(pg_blocking_pids(pid)))`, pid).Scan(&waiting)
		return err == nil && waiting
	}, "the second transaction waits for the first's lock")
	select {
	case r := <-second:
		t.Fatalf("the second lock returned while the first held it: %+v", r)
	default:
	}
	_, err = s.SaveCheckpointTx(ctx, first, "billing", 3, 7, nil)
	require.NoError(t, err)
	require.NoError(t, first.Commit(ctx))
	r := <-second
	require.NoError(t, r.err)
	require.EqualValues(t, 7, r.pos, "the second sees the first's committed checkpoint")

	_, err = s.LockCheckpointTx(ctx, nil, "billing", -1)
	require.ErrorIs(t, err, eventsource.ErrInvalidCheckpoint)
}

// After a resize the store holds both generations' checkpoints (the old
// one's as its history); a subscription's count is its latest
// generation's, the buckets it serves, not the sum of the two.
func TestSubscriptionsCountTheLatestGenerationsCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStoreWithHead(t, 10)
	for _, slot := range []int{0, 1, eventsource.Slot(1, 0), eventsource.Slot(1, 1), eventsource.Slot(1, 2)} {
		_, err := s.SaveCheckpoint(ctx, "resized", slot, 5, nil)
		require.NoError(t, err)
	}
	_, err := s.SaveCheckpoint(ctx, "steady", 3, 5, nil)
	require.NoError(t, err)
	got, err := s.Subscriptions(ctx)
	require.NoError(t, err)
	require.Equal(t, []eventsource.SubscriptionStats{
		{Subscription: "resized", Checkpoints: 3},
		{Subscription: "steady", Checkpoints: 1},
	}, got)
}
