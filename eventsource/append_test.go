package eventsource_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)


func TestAppend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ExpectedVersionModes", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		res, err := s.Append(ctx, "account-1", eventsource.NoStream, []eventsource.EventData{ev("Opened", `{}`), ev("Deposited", `{"n":1}`)})
		require.NoError(t, err)
		require.Equal(t, int64(0), res.FirstVersion)
		require.Equal(t, int64(1), res.LastVersion)

		_, err = s.Append(ctx, "account-1", eventsource.NoStream, []eventsource.EventData{ev("Opened", `{}`)})
		var wev *eventsource.WrongExpectedVersionError
		require.ErrorAs(t, err, &wev)
		require.Equal(t, int64(1), wev.Actual)
		require.ErrorIs(t, err, eventsource.ErrWrongExpectedVersion)

		_, err = s.Append(ctx, "account-1", eventsource.Exact(0), []eventsource.EventData{ev("X", `1`)})
		require.ErrorAs(t, err, &wev)
		require.Equal(t, int64(1), wev.Actual)

		res, err = s.Append(ctx, "account-1", eventsource.Exact(1), []eventsource.EventData{ev("X", `2`)})
		require.NoError(t, err)
		require.Equal(t, int64(2), res.LastVersion)

		res, err = s.Append(ctx, "account-1", eventsource.StreamExists, []eventsource.EventData{ev("X", `3`)})
		require.NoError(t, err)
		require.Equal(t, int64(3), res.LastVersion)

		_, err = s.Append(ctx, "account-2", eventsource.StreamExists, []eventsource.EventData{ev("X", `3`)})
		require.ErrorAs(t, err, &wev)
		require.Equal(t, int64(-1), wev.Actual)

		_, err = s.Append(ctx, "account-2", eventsource.Exact(0), []eventsource.EventData{ev("X", `3`)})
		require.ErrorAs(t, err, &wev)

		res, err = s.Append(ctx, "account-2", eventsource.Any, []eventsource.EventData{ev("X", `3`)})
		require.NoError(t, err)
		require.Equal(t, int64(0), res.LastVersion)
		res, err = s.Append(ctx, "account-2", eventsource.Any, []eventsource.EventData{ev("X", `4`)})
		require.NoError(t, err)
		require.Equal(t, int64(1), res.LastVersion)

		got, err := s.ReadStream(ctx, "account-1", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 4)
		for i, e := range got {
			require.Equal(t, int64(i), e.Version)
			require.Equal(t, "account", e.Category)
		}
	})

	t.Run("FailingBatchWritesNothing", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		first, err := s.Append(ctx, "order-9", eventsource.Any, []eventsource.EventData{ev("A", `{}`)})
		require.NoError(t, err)
		dup := ev("B", `{}`)
		dup.ID = first.IDs[0]
		_, err = s.Append(ctx, "order-9", eventsource.Any, []eventsource.EventData{ev("C", `{}`), dup})
		require.True(t, errors.Is(err, eventsource.ErrDuplicateEventID), "got %v", err)
		got, err := s.ReadStream(ctx, "order-9", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 1)

		_, err = s.Append(ctx, "order-9", eventsource.Any, []eventsource.EventData{ev("C", `{}`), ev("D", `{not json`)})
		var evErr *eventsource.EventError
		require.ErrorAs(t, err, &evErr)
		require.Equal(t, 1, evErr.Index)
		got, err = s.ReadStream(ctx, "order-9", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 1)
	})

	t.Run("SequencedInCommitOrder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for i := 0; i < 10; i++ {
			_, err := s.Append(ctx, "cart-"+string(rune('a'+i%3)), eventsource.Any, []eventsource.EventData{ev("A", `{}`)})
			require.NoError(t, err)
		}
		all, err := s.ReadAll(ctx, 0, 0)
		require.NoError(t, err)
		require.Empty(t, all, "nothing is visible by position before sequencing")
		n, err := s.Sequence(ctx)
		require.NoError(t, err)
		require.Equal(t, 10, n)
		all, err = s.ReadAll(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, all, 10)
		for i, e := range all {
			require.Equal(t, int64(i+1), e.Position)
		}
		head, err := s.HeadPosition(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(10), head)
		require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 3))
		total := 0
		for m := 0; m < 3; m++ {
			part, err := s.ReadMember(ctx, "cart", m, 3, 0, 0)
			require.NoError(t, err)
			for _, e := range part {
				require.Equal(t, m, e.Bucket(3))
			}
			total += len(part)
		}
		require.Equal(t, 10, total)
	})
}
