package admin_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/admin"
	"github.com/kumi-run/kumi/leasestore"
)

// parkWithLease parks e's stream for sub as the worker holding its bucket
// of n does: fenced by the lease it was granted. It returns that fence.
func (f *fixture) parkWithLease(t *testing.T, sub string, e eventsource.RecordedEvent, n int) (eventsource.Fence, *leasestore.Store) {
	t.Helper()
	ls := f.lease(t, sub, "w1", n)
	res, err := ls.Renew(context.Background())
	require.NoError(t, err)
	b := e.Bucket(n)
	var epoch int64
	for _, l := range res.Owned {
		if l.Bucket == b {
			epoch = l.Epoch
		}
	}
	require.NotZero(t, epoch, "w1 holds bucket %d", b)
	fence := ls.Fence(b, epoch)
	_, err = f.store.ParkStream(context.Background(), eventsource.DeadLetter{Subscription: sub, Bucket: b, EventID: e.ID,
		Reason: "no such account", Attempts: 5}, fence)
	require.NoError(t, err)
	return fence, ls
}

func TestParkedStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("BadInputIsRefusedBeforeAnythingChanges", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.parkWithLease(t, "billing", f.events[1], 2)
		stream := f.events[1].Stream
		for _, c := range []struct {
			p      admin.Park
			kind   admin.Kind
			reason error
		}{
			{admin.Park{Subscription: "billing", Stream: "nodash", Action: eventsource.ParkReplay}, admin.BadInput, admin.ErrBadStream},
			{admin.Park{Subscription: "billing", Stream: stream, Action: "rewind"}, admin.BadInput, admin.ErrBadAction},
			{admin.Park{Subscription: "billing", Stream: stream, Action: eventsource.ParkSkip}, admin.BadInput, admin.ErrUnconfirmed},
			{admin.Park{Subscription: "billing", Stream: stream, Action: eventsource.ParkSkip, Confirm: "acct-9"}, admin.BadInput, admin.ErrUnconfirmed},
			{admin.Park{Subscription: "nobody", Stream: stream, Action: eventsource.ParkReplay}, admin.NotFound, admin.ErrUnknownSubscription},
			{admin.Park{Subscription: "billing", Stream: "acct-9", Action: eventsource.ParkDiscard}, admin.NotFound, admin.ErrNotParked},
		} {
			_, err := admin.ParkedStream(ctx, f.store, c.p)
			refusal(t, err, c.kind, c.reason)
		}
		got, err := f.store.ParkedStreams(ctx, "billing", eventsource.ParkedFilter{})
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Empty(t, got[0].Action, "nothing was asked")
		_, err = f.store.DeadLetter(ctx, "billing", f.events[1].ID)
		require.NoError(t, err, "the letter stays")
	})

	t.Run("EachActionIsRecordedOnceAndTheReaderCarriesItOutUnderItsLease", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		e := f.events[2]
		fence, _ := f.parkWithLease(t, "billing", e, 2)
		ps, err := admin.ParkedStream(ctx, f.store, admin.Park{Subscription: "billing", Stream: e.Stream, Action: eventsource.ParkReplay})
		require.NoError(t, err)
		require.Equal(t, eventsource.ParkReplay, ps.Action)
		_, err = admin.ParkedStream(ctx, f.store, admin.Park{Subscription: "billing", Stream: e.Stream,
			Action: eventsource.ParkSkip, Confirm: e.Stream})
		refusal(t, err, admin.Conflict, admin.ErrParkedBusy)

		step := eventsource.ParkedRelease{Subscription: "billing", Stream: e.Stream, Buckets: 2, Bucket: e.Bucket(2),
			Through: e.Version, Fence: fence}
		_, err = f.store.ReleaseParked(ctx, nil, step)
		require.NoError(t, err, "the holder's release step")

		// An operator's forced reset fences the holder out: its epoch is stale.
		require.NoError(t, pgx.BeginFunc(ctx, f.store.Pool(), func(tx pgx.Tx) error {
			_, err := leasestore.FenceOut(ctx, tx, f.schema, "billing", e.Bucket(2), true)
			return err
		}))
		step.Through, step.Done = e.Version+10, true
		_, err = f.store.ReleaseParked(ctx, nil, step)
		require.ErrorIs(t, err, eventsource.ErrFenceLost, "a stale epoch is refused")
		got, err := f.store.ParkedStreams(ctx, "billing", eventsource.ParkedFilter{Stream: e.Stream})
		require.NoError(t, err)
		require.Len(t, got, 1, "the row stays for the bucket's next holder")
		require.Equal(t, e.Version, got[0].DoneVersion)
	})

	t.Run("ALetterThatParksItsStreamIsReplayedThroughTheStream", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		e := f.events[1]
		f.parkWithLease(t, "billing", e, 1)
		d, err := admin.Letter(ctx, f.store, "billing", e.ID, false)
		require.NoError(t, err)
		called := false
		err = admin.Replay(ctx, f.store, d, false, func(context.Context, eventsource.RecordedEvent) error { called = true; return nil })
		r := refusal(t, err, admin.Conflict, admin.ErrLetterParks)
		require.Contains(t, r.Error(), "kumi parked replay")
		require.False(t, called, "the handler never saw it")
	})

	t.Run("DiscardDeletesTheLetterAndSkipKeepsIt", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		d, s := f.events[0], f.events[3]
		f.parkWithLease(t, "billing", d, 1)
		_, err := f.store.ParkStream(ctx, eventsource.DeadLetter{Subscription: "billing", EventID: s.ID, Reason: "x"}, nil)
		require.NoError(t, err)
		_, err = admin.ParkedStream(ctx, f.store, admin.Park{Subscription: "billing", Stream: d.Stream, Action: eventsource.ParkDiscard})
		require.NoError(t, err)
		_, err = f.store.DeadLetter(ctx, "billing", d.ID)
		require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound)
		ps, err := admin.ParkedStream(ctx, f.store, admin.Park{Subscription: "billing", Stream: s.Stream,
			Action: eventsource.ParkSkip, Confirm: s.Stream})
		require.NoError(t, err)
		require.Equal(t, eventsource.ParkSkip, ps.Action)
		_, err = f.store.DeadLetter(ctx, "billing", s.ID)
		require.NoError(t, err)
	})
}
