package eventsource_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// deadLetterBundle is a store with events of a subscription, sequenced.
type deadLetterBundle struct {
	s      *eventsource.Store
	events []eventsource.RecordedEvent
}

func setupDeadLetters(t *testing.T, n int) deadLetterBundle {
	t.Helper()
	s := newStore(t)
	for i := range n {
		mustAppend(t, s, fmt.Sprintf("order-%d", i%4), ev("Placed", fmt.Sprintf(`{"i":%d}`, i)))
	}
	sequenceAll(t, s)
	evs, err := s.ReadAll(context.Background(), 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, n)
	return deadLetterBundle{s: s, events: evs}
}

func (b deadLetterBundle) add(t *testing.T, sub string, e eventsource.RecordedEvent, bucket int, reason string) eventsource.DeadLetter {
	t.Helper()
	d, err := b.s.AddDeadLetter(context.Background(), eventsource.DeadLetter{
		Subscription: sub, Bucket: bucket, EventID: e.ID, Reason: reason, Attempts: 3,
	})
	require.NoError(t, err)
	return d
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AddedLettersCanBeListedAndRead", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 6)
		e := b.events[2]
		d, err := b.s.AddDeadLetter(ctx, eventsource.DeadLetter{
			Subscription: "billing", Bucket: 1, EventID: e.ID, Position: e.Position, Stream: e.Stream,
			Reason: "card declined", Attempts: 5,
		})
		require.NoError(t, err)
		require.Equal(t, e.Position, d.Position)
		require.False(t, d.CreatedAt.IsZero())

		got, err := b.s.DeadLetter(ctx, "billing", e.ID)
		require.NoError(t, err)
		require.Equal(t, "billing", got.Subscription)
		require.Equal(t, 1, got.Bucket)
		require.Equal(t, e.ID, got.EventID)
		require.Equal(t, e.Position, got.Position)
		require.Equal(t, e.Stream, got.Stream)
		require.Equal(t, "card declined", got.Reason)
		require.Equal(t, 5, got.Attempts)
		require.Nil(t, got.ReplayedAt)

		_, err = b.s.DeadLetter(ctx, "billing", b.events[0].ID)
		require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound)
		_, err = b.s.DeadLetter(ctx, "shipping", e.ID)
		require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound, "letters are per subscription")
	})

	t.Run("PositionAndStreamComeFromTheEvent", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 3)
		d := b.add(t, "sub", b.events[1], 0, "boom")
		require.Equal(t, b.events[1].Position, d.Position)
		require.Equal(t, b.events[1].Stream, d.Stream)

		_, err := b.s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "sub", EventID: b.events[1].ID, Position: b.events[0].Position})
		require.ErrorIs(t, err, eventsource.ErrEventNotFound, "a position that is not the event's")
		_, err = b.s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "sub", EventID: b.events[1].ID, Stream: "order-99"})
		require.ErrorIs(t, err, eventsource.ErrEventNotFound, "a stream that is not the event's")
		_, err = b.s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "sub", EventID: uuid.New()})
		require.ErrorIs(t, err, eventsource.ErrEventNotFound, "an unknown event")
		require.Equal(t, 1, countRows(t, b.s, "dead_letters"))
	})

	t.Run("UnsequencedEventsCannotBeDeadLettered", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		res := mustAppend(t, s, "order-1", ev("Placed", `{}`))
		_, err := s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "sub", EventID: res.IDs[0]})
		require.ErrorIs(t, err, eventsource.ErrEventNotFound)
	})

	t.Run("BadLettersAreRefused", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 1)
		id := b.events[0].ID
		for _, c := range []struct {
			name string
			d    eventsource.DeadLetter
			want error
		}{
			{"EmptySubscription", eventsource.DeadLetter{EventID: id}, eventsource.ErrInvalidName},
			{"ControlCharInSubscription", eventsource.DeadLetter{Subscription: "a\x00b", EventID: id}, eventsource.ErrInvalidName},
			{"NegativeBucket", eventsource.DeadLetter{Subscription: "s", Bucket: -1, EventID: id}, eventsource.ErrInvalidDeadLetter},
			{"NoEventID", eventsource.DeadLetter{Subscription: "s"}, eventsource.ErrInvalidDeadLetter},
			{"NegativeAttempts", eventsource.DeadLetter{Subscription: "s", EventID: id, Attempts: -1}, eventsource.ErrInvalidDeadLetter},
			{"NegativePosition", eventsource.DeadLetter{Subscription: "s", EventID: id, Position: -1}, eventsource.ErrInvalidDeadLetter},
			{"InvalidStream", eventsource.DeadLetter{Subscription: "s", EventID: id, Stream: "nodash"}, eventsource.ErrInvalidName},
		} {
			_, err := b.s.AddDeadLetter(ctx, c.d)
			require.ErrorIs(t, err, c.want, c.name)
		}
		require.Equal(t, 0, countRows(t, b.s, "dead_letters"))
	})

	t.Run("ReasonIsStoredSafely", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 2)
		d := b.add(t, "sub", b.events[0], 0, "bad\x00byte \xff and 'quotes'; DROP TABLE x; --")
		require.Equal(t, "badbyte \uFFFD and 'quotes'; DROP TABLE x; --", d.Reason)
		long := strings.Repeat("é", eventsource.MaxDeadLetterReasonLength)
		d = b.add(t, "sub", b.events[1], 0, long)
		require.LessOrEqual(t, len(d.Reason), eventsource.MaxDeadLetterReasonLength)
		require.True(t, utf8.ValidString(d.Reason))
		got, err := b.s.DeadLetter(ctx, "sub", b.events[1].ID)
		require.NoError(t, err)
		require.Equal(t, d.Reason, got.Reason)
	})

	t.Run("ListingFiltersByBucketAndPages", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 10)
		for i, e := range b.events {
			b.add(t, "sub", e, i%2, fmt.Sprint("reason ", i))
		}
		b.add(t, "other", b.events[0], 0, "x")

		all, err := b.s.DeadLetters(ctx, "sub", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, all, 10)
		for i, d := range all {
			require.Equal(t, b.events[i].Position, d.Position, "position order")
		}

		one := 1
		odd, err := b.s.DeadLetters(ctx, "sub", eventsource.DeadLetterFilter{Bucket: &one})
		require.NoError(t, err)
		require.Len(t, odd, 5)
		for _, d := range odd {
			require.Equal(t, 1, d.Bucket)
		}

		var paged []eventsource.DeadLetter
		f := eventsource.DeadLetterFilter{Limit: 3}
		for {
			page, err := b.s.DeadLetters(ctx, "sub", f)
			require.NoError(t, err)
			paged = append(paged, page...)
			if len(page) < f.Limit {
				break
			}
			f.After = page[len(page)-1].Position
		}
		require.Equal(t, all, paged)
	})

	t.Run("ReplayHandsOverEventsMarksThemAndLeavesTheCheckpoint", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 8)
		_, err := b.s.SaveCheckpoint(ctx, "sub", 0, b.events[7].Position, nil)
		require.NoError(t, err)
		for _, i := range []int{1, 4, 6} {
			b.add(t, "sub", b.events[i], 0, "failed")
		}
		var got []eventsource.RecordedEvent
		n, err := b.s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{}, func(_ context.Context, e eventsource.RecordedEvent) error {
			got = append(got, e)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Equal(t, []eventsource.RecordedEvent{b.events[1], b.events[4], b.events[6]}, got)

		pending, err := b.s.DeadLetters(ctx, "sub", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Empty(t, pending)
		done, err := b.s.DeadLetters(ctx, "sub", eventsource.DeadLetterFilter{IncludeReplayed: true})
		require.NoError(t, err)
		require.Len(t, done, 3)
		for _, d := range done {
			require.NotNil(t, d.ReplayedAt)
		}

		cps, err := b.s.Checkpoints(ctx, "sub")
		require.NoError(t, err)
		require.Len(t, cps, 1)
		require.Equal(t, b.events[7].Position, cps[0].Position, "replay never moves the checkpoint")

		n, err = b.s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{}, func(context.Context, eventsource.RecordedEvent) error {
			t.Fatal("nothing is pending")
			return nil
		})
		require.NoError(t, err)
		require.Zero(t, n)

		// Dead-lettering an event again makes its letter pending again.
		b.add(t, "sub", b.events[4], 0, "failed again")
		d, err := b.s.DeadLetter(ctx, "sub", b.events[4].ID)
		require.NoError(t, err)
		require.Nil(t, d.ReplayedAt)
		require.Equal(t, "failed again", d.Reason)
	})

	t.Run("ReplayStopsAtAHandlerErrorAndRecordsIt", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 5)
		for _, e := range b.events {
			b.add(t, "sub", e, 0, "first failure")
		}
		boom := errors.New("still broken")
		calls := 0
		n, err := b.s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{}, func(_ context.Context, e eventsource.RecordedEvent) error {
			calls++
			if e.ID == b.events[2].ID {
				return boom
			}
			return nil
		})
		require.ErrorIs(t, err, boom)
		require.Equal(t, 2, n)
		require.Equal(t, 3, calls)
		d, err := b.s.DeadLetter(ctx, "sub", b.events[2].ID)
		require.NoError(t, err)
		require.Nil(t, d.ReplayedAt)
		require.Equal(t, 4, d.Attempts)
		require.Equal(t, "replay: still broken", d.Reason)

		n, err = b.s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{Limit: 2}, func(context.Context, eventsource.RecordedEvent) error { return nil })
		require.NoError(t, err)
		require.Equal(t, 2, n, "Limit bounds a replay")
		pending, err := b.s.DeadLetters(ctx, "sub", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, pending, 1)
		require.Equal(t, b.events[4].ID, pending[0].EventID)
	})

	t.Run("ConcurrentReplaysHandEachLetterOverOnce", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 40)
		for _, e := range b.events {
			b.add(t, "sub", e, 0, "x")
		}
		var mu sync.Mutex
		seen := map[uuid.UUID]int{}
		var total atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := b.s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{}, func(_ context.Context, e eventsource.RecordedEvent) error {
					mu.Lock()
					seen[e.ID]++
					mu.Unlock()
					return nil
				})
				assertNoError(t, err)
				total.Add(int64(n))
			}()
		}
		wg.Wait()
		require.Equal(t, int64(40), total.Load())
		require.Len(t, seen, 40)
		for id, n := range seen {
			require.Equal(t, 1, n, "event %s", id)
		}
	})

	t.Run("AddDeadLetterTxRollsBackWithTheCallersTransaction", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 2)
		tx, err := b.s.Pool().Begin(ctx)
		require.NoError(t, err)
		_, err = b.s.AddDeadLetterTx(ctx, tx, eventsource.DeadLetter{Subscription: "sub", EventID: b.events[0].ID, Reason: "x"})
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.Equal(t, 0, countRows(t, b.s, "dead_letters"))

		require.NoError(t, pgx.BeginFunc(ctx, b.s.Pool(), func(tx pgx.Tx) error {
			if _, err := b.s.AddDeadLetterTx(ctx, tx, eventsource.DeadLetter{Subscription: "sub", EventID: b.events[0].ID}); err != nil {
				return err
			}
			_, err := b.s.SaveCheckpointTx(ctx, tx, "sub", 0, b.events[0].Position, nil)
			return err
		}))
		require.Equal(t, 1, countRows(t, b.s, "dead_letters"))
	})

	t.Run("DeleteDiscardsALetter", func(t *testing.T) {
		t.Parallel()
		b := setupDeadLetters(t, 1)
		b.add(t, "sub", b.events[0], 0, "x")
		ok, err := b.s.DeleteDeadLetter(ctx, "sub", b.events[0].ID)
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = b.s.DeleteDeadLetter(ctx, "sub", b.events[0].ID)
		require.NoError(t, err)
		require.False(t, ok)
	})
}

// A filter's bucket beyond int4 was sent to PostgreSQL, and the encoder's
// error quoted the *int's address; it is refused with a typed error.
func TestDeadLetterFilterBucketOutOfRange(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	for _, b := range []int{-1, 1 << 31} {
		_, err := s.DeadLetters(context.Background(), "shipping", eventsource.DeadLetterFilter{Bucket: &b})
		require.ErrorIs(t, err, eventsource.ErrInvalidDeadLetter, "bucket %d", b)
		require.NotContains(t, err.Error(), "0x")
		require.Contains(t, err.Error(), fmt.Sprintf("filter bucket %d", b))
	}
}
