package eventsource_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// staleFence refuses like a lease store's fence for an epoch that was
// taken over.
var staleFence = eventsource.FenceFunc(func(context.Context, pgx.Tx) error {
	return fmt.Errorf("%w: bucket held at epoch 3, not 2", eventsource.ErrFenceLost)
})

// parkedBundle is a store with streams order-0 … order-3 of 5 events each,
// sequenced, their events by stream.
type parkedBundle struct {
	s        *eventsource.Store
	byStream map[string][]eventsource.RecordedEvent
}

func setupParked(t *testing.T) parkedBundle {
	t.Helper()
	b := setupDeadLetters(t, 20)
	p := parkedBundle{s: b.s, byStream: map[string][]eventsource.RecordedEvent{}}
	for _, e := range b.events {
		p.byStream[e.Stream] = append(p.byStream[e.Stream], e)
	}
	return p
}

func (p parkedBundle) park(t *testing.T, sub string, e eventsource.RecordedEvent, reason string) eventsource.ParkedStream {
	t.Helper()
	ps, err := p.s.ParkStream(context.Background(), eventsource.DeadLetter{
		Subscription: sub, Bucket: e.Bucket(4), EventID: e.ID, Reason: reason, Attempts: 5}, nil)
	require.NoError(t, err)
	return ps
}

func (p parkedBundle) row(t *testing.T, sub, stream string) (eventsource.ParkedStream, bool) {
	t.Helper()
	got, err := p.s.ParkedStreams(context.Background(), sub, eventsource.ParkedFilter{Stream: stream})
	require.NoError(t, err)
	if len(got) == 0 {
		return eventsource.ParkedStream{}, false
	}
	return got[0], true
}

// release runs a release step of stream's bucket in a 4-bucket generation.
func (p parkedBundle) release(sub string, e eventsource.RecordedEvent, through int64, done bool, fence eventsource.Fence) (eventsource.ParkedStream, error) {
	return p.s.ReleaseParked(context.Background(), nil, eventsource.ParkedRelease{Subscription: sub, Stream: e.Stream,
		Buckets: 4, Bucket: e.Bucket(4), Through: through, Done: done, Fence: fence})
}

func TestParkedStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ParkingWritesTheLetterAndOneRowAtTheLettersEvent", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		e := p.byStream["order-1"][1]
		ps, err := p.s.ParkStream(ctx, eventsource.DeadLetter{Subscription: "billing", Generation: 2, Bucket: 3,
			EventID: e.ID, Reason: "no such account", Attempts: 5}, nil)
		require.NoError(t, err)
		require.Equal(t, "order-1", ps.Stream)
		require.Equal(t, e.ID, ps.EventID)
		require.Equal(t, e.Position, ps.Position)
		require.Equal(t, e.Version, ps.Version)
		require.Equal(t, e.Version, ps.DoneVersion, "the letter's event is done: dead-lettered")
		require.Equal(t, e.Hash, ps.Hash)
		require.Equal(t, "no such account", ps.Reason)
		require.Empty(t, ps.Action)
		require.Nil(t, ps.RequestedAt)
		require.Equal(t, int64(3), ps.Waiting, "the stream's three events after the letter's wait")
		d, err := p.s.DeadLetter(ctx, "billing", e.ID)
		require.NoError(t, err)
		require.Equal(t, "no such account", d.Reason)
		require.Equal(t, []int{2, 3}, []int{d.Generation, d.Bucket}, "the letter records where it was parked")
		require.Equal(t, 1, countRows(t, p.s, "parked_streams"), "one row, no copy of the events")
	})

	t.Run("AStaleFenceParksNothing", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		e := p.byStream["order-2"][0]
		_, err := p.s.ParkStream(ctx, eventsource.DeadLetter{Subscription: "billing", EventID: e.ID, Reason: "x"}, staleFence)
		require.ErrorIs(t, err, eventsource.ErrFenceLost)
		_, err = p.s.DeadLetter(ctx, "billing", e.ID)
		require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound, "no letter without the row")
		require.Zero(t, countRows(t, p.s, "parked_streams"))
	})

	t.Run("BadInputIsRefusedTyped", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		e := p.byStream["order-0"][0]
		_, err := p.s.ParkStream(ctx, eventsource.DeadLetter{Subscription: "billing", EventID: e.ID, Stream: "order-9"}, nil)
		require.ErrorIs(t, err, eventsource.ErrEventNotFound, "a stream that is not the event's")
		_, err = p.s.ParkedStreams(ctx, "billing", eventsource.ParkedFilter{Buckets: 4, Bucket: 4})
		require.ErrorIs(t, err, eventsource.ErrInvalidDeadLetter)
		_, err = p.s.ParkedStreams(ctx, "", eventsource.ParkedFilter{})
		require.Error(t, err)
		_, err = p.s.RequestRelease(ctx, "billing", "order-0", "rewind")
		require.ErrorIs(t, err, eventsource.ErrInvalidDeadLetter)
		_, err = p.s.RequestRelease(ctx, "billing", "no dash", eventsource.ParkReplay)
		require.Error(t, err)
		_, err = p.s.RequestRelease(ctx, "billing", "order-0", eventsource.ParkReplay)
		require.ErrorIs(t, err, eventsource.ErrNotParked, "a stream never parked")
		_, err = p.release("billing", e, -1, false, nil)
		require.ErrorIs(t, err, eventsource.ErrInvalidDeadLetter)
		_, err = p.s.ReleaseParked(ctx, nil, eventsource.ParkedRelease{Subscription: "billing", Stream: "order-0"})
		require.ErrorIs(t, err, eventsource.ErrInvalidDeadLetter, "a release names its bucket")
		_, err = p.release("billing", e, 1, false, nil)
		require.ErrorIs(t, err, eventsource.ErrNotParked)
	})

	t.Run("AParkedStreamIsParkedOnce", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		first := p.park(t, "billing", p.byStream["order-3"][1], "first")
		again := p.park(t, "billing", p.byStream["order-3"][1], "first")
		require.Equal(t, first.EventID, again.EventID, "the same letter again (a retried write) is the same row")
		later := p.byStream["order-3"][3]
		_, err := p.s.ParkStream(ctx, eventsource.DeadLetter{Subscription: "billing", EventID: later.ID, Reason: "later"}, nil)
		require.ErrorIs(t, err, eventsource.ErrParkConflict, "its later events are not delivered, so none is dead-lettered")
		_, err = p.s.DeadLetter(ctx, "billing", later.ID)
		require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound, "the refused park wrote no letter")
		other := p.park(t, "shipping", later, "another subscription")
		require.Equal(t, later.ID, other.EventID, "parking is per subscription")
	})

	t.Run("TheListIsPerBucketPagedAndCountsWaitingFromTheStream", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		for _, st := range []string{"order-0", "order-1", "order-2", "order-3"} {
			p.park(t, "billing", p.byStream[st][2], "bad "+st)
		}
		p.park(t, "shipping", p.byStream["order-0"][0], "elsewhere")
		all, err := p.s.ParkedStreams(ctx, "billing", eventsource.ParkedFilter{})
		require.NoError(t, err)
		require.Len(t, all, 4)
		for i, ps := range all {
			require.Equal(t, fmt.Sprintf("order-%d", i), ps.Stream, "by stream name")
			require.Equal(t, int64(2), ps.Waiting)
		}
		seen := 0
		for b := range 4 {
			got, err := p.s.ParkedStreams(ctx, "billing", eventsource.ParkedFilter{Buckets: 4, Bucket: b})
			require.NoError(t, err)
			for _, ps := range got {
				require.Equal(t, b, eventsource.BucketOfHash(ps.Hash, 4))
			}
			seen += len(got)
		}
		require.Equal(t, 4, seen, "every parked stream in exactly one bucket")
		page, err := p.s.ParkedStreams(ctx, "billing", eventsource.ParkedFilter{After: "order-1", Limit: 1})
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, "order-2", page[0].Stream)
		mustAppend(t, p.s, "order-2", ev("Placed", `{}`), ev("Placed", `{}`))
		ps, _ := p.row(t, "billing", "order-2")
		require.Equal(t, int64(4), ps.Waiting, "appends to a parked stream wait behind it")
	})

	t.Run("AnOperatorsRequestsFollowTheStatesOfTheRow", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		replayed := p.park(t, "billing", p.byStream["order-0"][1], "r")
		r, err := p.s.RequestRelease(ctx, "billing", "order-0", eventsource.ParkReplay)
		require.NoError(t, err)
		require.Equal(t, eventsource.ParkReplay, r.Action)
		require.NotNil(t, r.RequestedAt)
		require.Equal(t, replayed.Version-1, r.DoneVersion, "the letter's event is due again")
		require.Equal(t, int64(4), r.Waiting, "the letter's event and the three after it")
		_, err = p.s.RequestRelease(ctx, "billing", "order-0", eventsource.ParkSkip)
		require.ErrorIs(t, err, eventsource.ErrParkConflict, "a stream being released takes no other request")

		discarded := p.park(t, "billing", p.byStream["order-1"][1], "d")
		r, err = p.s.RequestRelease(ctx, "billing", "order-1", eventsource.ParkDiscard)
		require.NoError(t, err)
		require.Equal(t, discarded.Version, r.DoneVersion, "the letter's event stays done")
		_, err = p.s.DeadLetter(ctx, "billing", discarded.EventID)
		require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound, "discard deletes the letter with the request")

		skipped := p.park(t, "billing", p.byStream["order-2"][1], "s")
		r, err = p.s.RequestRelease(ctx, "billing", "order-2", eventsource.ParkSkip)
		require.NoError(t, err)
		require.Equal(t, eventsource.ParkSkip, r.Action)
		_, err = p.s.RequestRelease(ctx, "billing", "order-2", eventsource.ParkReplay)
		require.ErrorIs(t, err, eventsource.ErrParkConflict, "skipped for good")
		_, err = p.release("billing", p.byStream["order-2"][4], 4, true, nil)
		require.ErrorIs(t, err, eventsource.ErrParkConflict, "a skipped stream is never released")
		_, err = p.s.DeadLetter(ctx, "billing", skipped.EventID)
		require.NoError(t, err, "a skip keeps the letter")
		_, err = p.s.ParkStream(ctx, eventsource.DeadLetter{Subscription: "billing", EventID: p.byStream["order-2"][3].ID}, nil)
		require.ErrorIs(t, err, eventsource.ErrParkConflict)

		p.park(t, "billing", p.byStream["order-3"][1], "still parked")
		due, err := p.s.ParkedStreams(ctx, "billing", eventsource.ParkedFilter{Requested: true})
		require.NoError(t, err)
		var names []string
		for _, d := range due {
			names = append(names, d.Stream)
		}
		require.Equal(t, []string{"order-0", "order-1"}, names, "the releases due: neither the skipped stream nor the one still parked")
	})

	t.Run("AReplayedReleaseDeliversTheLetterThenTheRestAndEnds", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		evs := p.byStream["order-3"]
		ps := p.park(t, "billing", evs[1], "bad")
		_, err := p.release("billing", evs[1], ps.Version, false, nil)
		require.ErrorIs(t, err, eventsource.ErrParkConflict, "no release before an operator asks")
		_, err = p.s.RequestRelease(ctx, "billing", "order-3", eventsource.ParkReplay)
		require.NoError(t, err)

		wrong := (evs[1].Bucket(4) + 1) % 4
		_, err = p.s.ReleaseParked(ctx, nil, eventsource.ParkedRelease{Subscription: "billing", Stream: "order-3",
			Buckets: 4, Bucket: wrong, Through: ps.Version})
		require.ErrorIs(t, err, eventsource.ErrNotParked, "another bucket's reader does not touch it")
		_, err = p.release("billing", evs[1], ps.Version, false, staleFence)
		require.ErrorIs(t, err, eventsource.ErrFenceLost)
		r, _ := p.row(t, "billing", "order-3")
		require.Equal(t, ps.Version-1, r.DoneVersion, "a stale epoch moves nothing")
		_, err = p.release("billing", evs[1], ps.Version-1, true, nil)
		require.ErrorIs(t, err, eventsource.ErrParkConflict, "the release cannot end before the letter's event")

		// The reader reads the stream from DoneVersion+1, in order, up to
		// its bound (here the stream's end), one page at a time.
		var got []eventsource.RecordedEvent
		for {
			r, _ := p.row(t, "billing", "order-3")
			page, err := p.s.ReadStream(ctx, "order-3", r.DoneVersion+1, 2)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				got = append(got, e)
				_, err := p.release("billing", e, e.Version, false, nil)
				require.NoError(t, err)
			}
		}
		require.Equal(t, evs[1:], got, "the letter's event, then the rest, in order")
		d, err := p.s.DeadLetter(ctx, "billing", ps.EventID)
		require.NoError(t, err)
		require.NotNil(t, d.ReplayedAt, "the letter is marked replayed once its event is done")
		last := evs[len(evs)-1]
		done, err := p.release("billing", last, last.Version, true, nil)
		require.NoError(t, err)
		require.Equal(t, last.Version, done.DoneVersion)
		_, parked := p.row(t, "billing", "order-3")
		require.False(t, parked, "released: the row is gone")
		_, err = p.release("billing", last, last.Version, true, nil)
		require.ErrorIs(t, err, eventsource.ErrNotParked)
	})

	t.Run("AStepInTheCallersTransactionCommitsWithItOrNotAtAll", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		evs := p.byStream["order-0"]
		ps := p.park(t, "billing", evs[0], "bad")
		_, err := p.s.RequestRelease(ctx, "billing", "order-0", eventsource.ParkDiscard)
		require.NoError(t, err)
		step := eventsource.ParkedRelease{Subscription: "billing", Stream: "order-0", Buckets: 4, Bucket: evs[0].Bucket(4)}
		tx, err := p.s.Pool().Begin(ctx)
		require.NoError(t, err)
		lock := step
		lock.Through = 0
		cur, err := p.s.ReleaseParked(ctx, tx, lock)
		require.NoError(t, err)
		require.Equal(t, ps.Version, cur.DoneVersion, "a step below DoneVersion reads the row as it is")
		step.Through = evs[1].Version
		_, err = p.s.ReleaseParked(ctx, tx, step)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		r, _ := p.row(t, "billing", "order-0")
		require.Equal(t, ps.Version, r.DoneVersion, "rolled back with the caller's transaction")
	})

	t.Run("ALetterThatParksItsStreamIsNotReplayedOutOfOrder", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		parked := p.park(t, "billing", p.byStream["order-0"][1], "parks")
		plain, err := p.s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "billing", EventID: p.byStream["order-1"][0].ID})
		require.NoError(t, err)
		var handled []string
		handler := func(_ context.Context, e eventsource.RecordedEvent) error {
			handled = append(handled, e.ID.String())
			return nil
		}
		d, err := p.s.DeadLetter(ctx, "billing", parked.EventID)
		require.NoError(t, err)
		ok, err := p.s.ReplayDeadLetter(ctx, d, false, handler)
		require.ErrorIs(t, err, eventsource.ErrParkConflict, "its release replays it, in order")
		require.False(t, ok)
		n, err := p.s.ReplayDeadLetters(ctx, "billing", eventsource.DeadLetterFilter{}, handler)
		require.ErrorIs(t, err, eventsource.ErrParkConflict)
		require.Equal(t, 1, n, "the letter before it (position order) was replayed")
		require.Equal(t, []string{plain.EventID.String()}, handled, "the parking letter was not handed out")
		d, err = p.s.DeadLetter(ctx, "billing", parked.EventID)
		require.NoError(t, err)
		require.Nil(t, d.ReplayedAt)
		require.Equal(t, 5, d.Attempts, "a refusal is not a failed attempt")
	})

	t.Run("AReleasedEventDeadLetteredAgainParksTheStreamThere", func(t *testing.T) {
		t.Parallel()
		p := setupParked(t)
		evs := p.byStream["order-1"]
		ps := p.park(t, "billing", evs[0], "first")
		_, err := p.s.RequestRelease(ctx, "billing", "order-1", eventsource.ParkDiscard)
		require.NoError(t, err)
		_, err = p.release("billing", evs[2], evs[2].Version, false, nil)
		require.NoError(t, err)
		_, err = p.s.ParkStream(ctx, eventsource.DeadLetter{Subscription: "billing", EventID: evs[1].ID, Reason: "again"}, nil)
		require.ErrorIs(t, err, eventsource.ErrParkConflict, "an event the release has done is not dead-lettered")
		again, err := p.s.ParkStream(ctx, eventsource.DeadLetter{Subscription: "billing", EventID: evs[3].ID, Reason: "again"}, nil)
		require.NoError(t, err)
		require.Equal(t, evs[3].ID, again.EventID)
		require.Equal(t, evs[3].Version, again.DoneVersion)
		require.Empty(t, again.Action, "parked again: an operator decides anew")
		require.Equal(t, "again", again.Reason)
		require.True(t, ps.ParkedAt.Equal(again.ParkedAt), "the stream has waited since it was first parked")
		require.Equal(t, int64(1), again.Waiting)
	})
}
