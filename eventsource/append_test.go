package eventsource_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
		require.Equal(t, eventsource.NoStream, wev.Expected)
		require.Equal(t, "account-1", wev.Stream)
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
		require.Equal(t, int64(-1), wev.Actual)

		res, err = s.Append(ctx, "account-2", eventsource.Any, []eventsource.EventData{ev("X", `3`)})
		require.NoError(t, err)
		require.Equal(t, int64(0), res.LastVersion)
		res, err = s.Append(ctx, "account-2", eventsource.Any, []eventsource.EventData{ev("X", `4`)})
		require.NoError(t, err)
		require.Equal(t, int64(1), res.LastVersion)

		res, err = s.Append(ctx, "account-3", eventsource.Exact(-1), []eventsource.EventData{ev("X", `1`)})
		require.NoError(t, err, "Exact(-1) is NoStream")
		require.Equal(t, int64(0), res.LastVersion)

		got, err := s.ReadStream(ctx, "account-1", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 4)
		for i, e := range got {
			require.Equal(t, int64(i), e.Version)
			require.Equal(t, "account", e.Category)
		}
		require.Equal(t, 3, countRows(t, s, "streams"))
		require.Equal(t, 7, countRows(t, s, "events"), "no conflicting append wrote anything")
	})

	t.Run("ConcurrentExactAppendsLetExactlyOneWin", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustAppend(t, s, "race-1", ev("Opened", `{}`))
		const n = 12
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = s.Append(ctx, "race-1", eventsource.Exact(0), []eventsource.EventData{ev("Raced", `{}`), ev("Raced", `{}`)})
			}()
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			if err == nil {
				wins++
				continue
			}
			var wev *eventsource.WrongExpectedVersionError
			require.ErrorAs(t, err, &wev)
			require.Equal(t, int64(2), wev.Actual)
		}
		require.Equal(t, 1, wins)
		require.Equal(t, 3, countRows(t, s, "events"))
	})

	t.Run("ConcurrentNoStreamAppendsLetExactlyOneWin", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		const n = 12
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = s.Append(ctx, "fresh-1", eventsource.NoStream, []eventsource.EventData{ev("Opened", `{}`)})
			}()
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			if err == nil {
				wins++
			} else {
				require.ErrorIs(t, err, eventsource.ErrWrongExpectedVersion)
			}
		}
		require.Equal(t, 1, wins)
		require.Equal(t, 1, countRows(t, s, "events"))
	})

	t.Run("ConcurrentAnyAppendsGetContiguousVersions", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		const writers, each = 8, 10
		var wg sync.WaitGroup
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					_, err := s.Append(ctx, "busy-1", eventsource.Any, []eventsource.EventData{ev("A", `{}`), ev("B", `{}`)})
					if !assertNoError(t, err) {
						return
					}
				}
			}()
		}
		wg.Wait()
		got, err := s.ReadStream(ctx, "busy-1", 0, 1000)
		require.NoError(t, err)
		require.Len(t, got, writers*each*2)
		for i, e := range got {
			require.Equal(t, int64(i), e.Version)
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

		same := uuid.New()
		a, b := ev("A", `{}`), ev("B", `{}`)
		a.ID, b.ID = same, same
		_, err = s.Append(ctx, "order-10", eventsource.Any, []eventsource.EventData{a, b})
		require.ErrorIs(t, err, eventsource.ErrDuplicateEventID, "a batch repeating an id")

		_, err = s.Append(ctx, "order-9", eventsource.Any, []eventsource.EventData{ev("C", `{}`), ev("D", `{not json`)})
		var evErr *eventsource.EventError
		require.ErrorAs(t, err, &evErr)
		require.Equal(t, 1, evErr.Index)

		_, err = s.Append(ctx, "order-9", eventsource.Exact(7), []eventsource.EventData{ev("C", `{}`), ev("D", `{}`)})
		require.ErrorIs(t, err, eventsource.ErrWrongExpectedVersion)

		got, err := s.ReadStream(ctx, "order-9", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, 1, countRows(t, s, "events"))
		require.Equal(t, 1, countRows(t, s, "streams"), "the failed new stream order-10 left no row")

		var version int64
		require.NoError(t, s.Pool().QueryRow(ctx, "SELECT version FROM "+s.QuotedSchema()+".streams WHERE stream_name = 'order-9'").Scan(&version))
		require.Equal(t, int64(0), version, "the stream's version did not move")
	})

	t.Run("IDsAreUUIDv7UnlessGiven", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		given := uuid.New()
		e := ev("Given", `{}`)
		e.ID = given
		res := mustAppend(t, s, "ids-1", ev("A", `{}`), e, ev("B", `{}`))
		require.Len(t, res.IDs, 3)
		require.Equal(t, uuid.Version(7), res.IDs[0].Version())
		require.Equal(t, given, res.IDs[1])
		require.Equal(t, uuid.Version(7), res.IDs[2].Version())
		got, err := s.ReadStream(ctx, "ids-1", 0, 0)
		require.NoError(t, err)
		for i, e := range got {
			require.Equal(t, res.IDs[i], e.ID)
		}
	})

	t.Run("AppendTxCommitsAndRollsBackWithTheCallersTransaction", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		tx, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		_, err = s.AppendTx(ctx, tx, "tx-1", eventsource.NoStream, []eventsource.EventData{ev("A", `{}`)})
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.Equal(t, 0, countRows(t, s, "events"))
		require.Equal(t, 0, countRows(t, s, "streams"))

		err = pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			if _, err := s.AppendTx(ctx, tx, "tx-1", eventsource.NoStream, []eventsource.EventData{ev("A", `{}`)}); err != nil {
				return err
			}
			_, err := s.AppendTx(ctx, tx, "tx-2", eventsource.NoStream, []eventsource.EventData{ev("B", `{}`)})
			return err
		})
		require.NoError(t, err)
		require.Equal(t, 2, countRows(t, s, "events"))
	})

	t.Run("AppendTxConflictLeavesTheTransactionUsable", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustAppend(t, s, "tx-3", ev("A", `{}`))
		err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
			_, err := s.AppendTx(ctx, tx, "tx-3", eventsource.NoStream, []eventsource.EventData{ev("B", `{}`)})
			require.ErrorIs(t, err, eventsource.ErrWrongExpectedVersion)
			_, err = s.AppendTx(ctx, tx, "tx-3", eventsource.Exact(0), []eventsource.EventData{ev("B", `{}`)})
			return err
		})
		require.NoError(t, err)
		got, err := s.ReadStream(ctx, "tx-3", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 2)
	})

	t.Run("SequencedInCommitOrder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for i := range 10 {
			mustAppend(t, s, "cart-"+string(rune('a'+i%3)), ev("A", `{}`))
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
	})
}

// assertNoError reports err from a goroutine other than the test's.
func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
