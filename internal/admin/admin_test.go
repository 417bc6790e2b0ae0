package admin_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/admin"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fixture is a migrated schema with 20 events of category acct.
type fixture struct {
	schema string
	store  *eventsource.Store
	events []eventsource.RecordedEvent
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	store, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, leasestore.Migrate(ctx, store.Pool(), schema))
	for i := range 20 {
		_, err := store.Append(ctx, fmt.Sprintf("acct-%d", i%4), eventsource.Any,
			[]eventsource.EventData{{Type: "Deposited", Data: []byte(`{}`)}})
		require.NoError(t, err)
	}
	_, err = store.Sequence(ctx)
	require.NoError(t, err)
	evs, err := store.ReadCategory(ctx, "acct", 0, 100)
	require.NoError(t, err)
	return &fixture{schema: schema, store: store, events: evs}
}

// join starts worker as a worker of sub's n buckets; it claims nothing
// until it passes.
func (f *fixture) join(t *testing.T, sub, worker string, n int) *leasestore.Store {
	t.Helper()
	s, err := leasestore.New(f.store.Pool(), leasestore.Config{Schema: f.schema, Subscription: sub, Worker: worker,
		Buckets: n, LeaseOptions: leasestore.LeaseOptions{TTL: time.Minute, NoListen: true}})
	if err == nil {
		err = s.Start(context.Background())
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s
}

// lease joins and runs one pass.
func (f *fixture) lease(t *testing.T, sub, worker string, n int) *leasestore.Store {
	t.Helper()
	s := f.join(t, sub, worker, n)
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	return s
}

// refusal asserts that err is a *admin.Refusal of kind and reason.
func refusal(t *testing.T, err error, kind admin.Kind, reason error) *admin.Refusal {
	t.Helper()
	var r *admin.Refusal
	require.ErrorAs(t, err, &r)
	require.Equal(t, kind, r.Kind, r.Error())
	require.ErrorIs(t, err, reason)
	return r
}

func TestResetCheckpointsGuardsThenFencesEachBucket(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	head := f.events[19].Position
	a := f.lease(t, "orders", "worker-a", 4)
	_, err := f.store.SaveCheckpoint(ctx, "orders", 2, head, a.Fence(2, 1))
	require.NoError(t, err)
	reset := func(r admin.Reset) ([]admin.BucketReset, error) {
		r.Subscription = "orders"
		return admin.ResetCheckpoints(ctx, f.store, r)
	}

	t.Run("BadInputIsRefusedBeforeAnyWrite", func(t *testing.T) {
		_, err := reset(admin.Reset{Buckets: []int{0}, Position: -1})
		require.Equal(t, int64(-1), refusal(t, err, admin.BadInput, admin.ErrBadPosition).Position)
		_, err = reset(admin.Reset{Position: 0})
		refusal(t, err, admin.BadInput, admin.ErrNoBuckets)
		_, err = reset(admin.Reset{Buckets: []int{0}, AllBuckets: true})
		refusal(t, err, admin.BadInput, admin.ErrNoBuckets)
		_, err = reset(admin.Reset{Buckets: []int{-1}})
		refusal(t, err, admin.BadInput, admin.ErrBadBucket)
		_, err = reset(admin.Reset{Buckets: []int{1, 4}})
		r := refusal(t, err, admin.BadInput, admin.ErrBucketOutOfRange)
		require.Equal(t, [2]int{4, 4}, [2]int{r.Bucket, r.Buckets})
		require.EqualError(t, r, `bucket 4: subscription "orders" has buckets 0 to 3`)
		_, err = reset(admin.Reset{Buckets: []int{0}, Position: head + 1})
		r = refusal(t, err, admin.BadInput, admin.ErrPastHead)
		require.Equal(t, head, r.Head)
		_, err = admin.ResetCheckpoints(ctx, f.store, admin.Reset{Subscription: "nosuch", Buckets: []int{0}})
		refusal(t, err, admin.NotFound, admin.ErrUnknownSubscription)
		_, err = admin.ResetCheckpoints(ctx, f.store, admin.Reset{Subscription: "bad\nname", Buckets: []int{0}})
		require.ErrorIs(t, err, eventsource.ErrInvalidName)
		cp, err := f.store.Checkpoint(ctx, "orders", 2)
		require.NoError(t, err)
		require.Equal(t, head, cp)
	})

	t.Run("ALiveOwnerIsRefusedUnlessForced", func(t *testing.T) {
		rs, err := reset(admin.Reset{Buckets: []int{2}, Position: 0})
		require.NoError(t, err)
		require.Len(t, rs, 1)
		r := refusal(t, rs[0].Refused, admin.Conflict, admin.ErrHeld)
		var held *leasestore.HeldError
		require.ErrorAs(t, r, &held)
		require.Equal(t, "worker-a", held.Owner)
		cp, err := f.store.Checkpoint(ctx, "orders", 2)
		require.NoError(t, err)
		require.Equal(t, head, cp)

		rs, err = reset(admin.Reset{Buckets: []int{2}, Position: 5, Force: true})
		require.NoError(t, err)
		require.Nil(t, rs[0].Refused)
		require.Equal(t, head, rs[0].Before)
		require.True(t, rs[0].Fenced.Live)
		require.Equal(t, "worker-a", rs[0].Fenced.Owner)
		// The owner is fenced out: its in-memory position cannot undo it.
		_, err = f.store.SaveCheckpoint(ctx, "orders", 2, head, a.Fence(2, 1))
		require.ErrorIs(t, err, eventsource.ErrFenceLost)
	})

	t.Run("EveryBucketOnceTheOwnerHasLeft", func(t *testing.T) {
		require.NoError(t, a.Leave(ctx))
		rs, err := reset(admin.Reset{AllBuckets: true, Position: head + 1, BeyondHead: true})
		require.NoError(t, err)
		require.Len(t, rs, 4)
		for i, r := range rs {
			require.Equal(t, i, r.Bucket)
			require.Nil(t, r.Refused)
			cp, err := f.store.Checkpoint(ctx, "orders", r.Slot)
			require.NoError(t, err)
			require.Equal(t, head+1, cp)
		}
		require.EqualValues(t, 5, rs[2].Before)
	})

	t.Run("AResizeInProgressRefusesIt", func(t *testing.T) {
		require.NoError(t, f.store.EnsureConsumerGroupIndex(ctx, 8))
		_, err := leasestore.RequestResize(ctx, f.store.Pool(), f.schema, leasestore.ResizeRequest{Subscription: "orders", Buckets: 8})
		require.NoError(t, err)
		_, err = reset(admin.Reset{Buckets: []int{0}, Position: 0})
		var inProgress *leasestore.ResizeInProgressError
		require.ErrorAs(t, err, &inProgress)
	})
}

func TestResetAllBucketsNeedsABucketCount(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	// Known by its dead letter alone: no lease rows, so no N.
	_, err := f.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "orders", Bucket: 1,
		EventID: f.events[0].ID, Reason: "boom", Attempts: 1})
	require.NoError(t, err)
	_, err = admin.ResetCheckpoints(ctx, f.store, admin.Reset{Subscription: "orders", AllBuckets: true})
	refusal(t, err, admin.BadInput, admin.ErrBucketsUnknown)
	// A named bucket resets: no lease row, nothing to fence.
	rs, err := admin.ResetCheckpoints(ctx, f.store, admin.Reset{Subscription: "orders", Buckets: []int{7, 7}, Position: 3})
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.False(t, rs[0].Fenced.Found)
	cp, err := f.store.Checkpoint(ctx, "orders", 7)
	require.NoError(t, err)
	require.EqualValues(t, 3, cp)
}

func TestRelinquishPlacesAClaimOrSaysWhyNot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, err := admin.Relinquish(ctx, f.store, "orders", -1, "")
	refusal(t, err, admin.BadInput, admin.ErrBadBucket)
	_, err = admin.Relinquish(ctx, f.store, "bad\nname", 0, "")
	require.ErrorIs(t, err, eventsource.ErrInvalidName)
	_, err = admin.Relinquish(ctx, f.store, "orders", 0, "")
	refusal(t, err, admin.NotFound, admin.ErrHandoffRefused)

	f.lease(t, "orders", "worker-a", 4)
	handoff := func(reason error) func(*testing.T, error) {
		return func(t *testing.T, err error) {
			var h *leasestore.HandoffError
			require.ErrorAs(t, err, &h)
			require.ErrorIs(t, h.Reason, reason)
		}
	}
	_, err = admin.Relinquish(ctx, f.store, "orders", 4, "")
	handoff(leasestore.ErrBucketOutOfRange)(t, refusal(t, err, admin.BadInput, admin.ErrHandoffRefused))
	_, err = admin.Relinquish(ctx, f.store, "orders", 0, "")
	r := refusal(t, err, admin.Conflict, admin.ErrHandoffRefused)
	handoff(leasestore.ErrNoOtherWorker)(t, r)
	require.EqualError(t, r, `worker-a is the only live worker of "orders": nobody could take bucket 0`)
	_, err = admin.Relinquish(ctx, f.store, "orders", 0, "ghost")
	handoff(leasestore.ErrTargetNotLive)(t, refusal(t, err, admin.BadInput, admin.ErrHandoffRefused))
	_, err = admin.Relinquish(ctx, f.store, "orders", 0, "worker-a")
	handoff(leasestore.ErrTargetIsOwner)(t, refusal(t, err, admin.BadInput, admin.ErrHandoffRefused))

	// A second worker, below its share, that has not passed yet: the
	// claim puts it at its share.
	f.join(t, "orders", "worker-b", 4)
	h, err := admin.Relinquish(ctx, f.store, "orders", 1, "")
	require.NoError(t, err)
	require.Equal(t, [2]string{"worker-a", "worker-b"}, [2]string{h.Owner, h.To})
	require.Equal(t, [3]int{1, 2, 0}, [3]int{h.Bucket, h.Share, h.Load})
	require.False(t, h.AboveShare)
	_, err = admin.Relinquish(ctx, f.store, "orders", 1, "")
	handoff(leasestore.ErrClaimPending)(t, refusal(t, err, admin.Conflict, admin.ErrHandoffRefused))
	h, err = admin.Relinquish(ctx, f.store, "orders", 2, "worker-b")
	require.NoError(t, err)
	require.Equal(t, 1, h.Load)
	require.False(t, h.AboveShare)
	// A third claim puts it above its share: it may withdraw it.
	h, err = admin.Relinquish(ctx, f.store, "orders", 3, "worker-b")
	require.NoError(t, err)
	require.Equal(t, 2, h.Load)
	require.True(t, h.AboveShare)
}

func TestReplayAndDiscardOneLetter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	letter := func(i int) eventsource.DeadLetter {
		d, err := f.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "orders", Bucket: 0,
			EventID: f.events[i].ID, Reason: "boom", Attempts: 1})
		require.NoError(t, err)
		return d
	}
	ok, failing := letter(0), letter(1)

	_, err := admin.Letter(ctx, f.store, "orders", uuid.New(), false)
	require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound)

	var handed []uuid.UUID
	handle := func(_ context.Context, ev eventsource.RecordedEvent) error {
		handed = append(handed, ev.ID)
		if ev.ID == failing.EventID {
			return errors.New("still failing")
		}
		return nil
	}
	d, err := admin.Letter(ctx, f.store, "orders", ok.EventID, false)
	require.NoError(t, err)
	require.NoError(t, admin.Replay(ctx, f.store, d, false, handle))
	_, err = admin.Letter(ctx, f.store, "orders", ok.EventID, false)
	refusal(t, err, admin.Conflict, admin.ErrAlreadyReplayed)
	d, err = admin.Letter(ctx, f.store, "orders", ok.EventID, true)
	require.NoError(t, err)
	require.NoError(t, admin.Replay(ctx, f.store, d, true, handle))

	d, err = admin.Letter(ctx, f.store, "orders", failing.EventID, false)
	require.NoError(t, err)
	require.ErrorContains(t, admin.Replay(ctx, f.store, d, false, handle), "still failing")
	require.Equal(t, []uuid.UUID{ok.EventID, ok.EventID, failing.EventID}, handed)
	d, err = f.store.DeadLetter(ctx, "orders", failing.EventID)
	require.NoError(t, err)
	require.Nil(t, d.ReplayedAt)

	require.NoError(t, admin.Discard(ctx, f.store, "orders", failing.EventID))
	refusal(t, admin.Discard(ctx, f.store, "orders", failing.EventID), admin.NotFound, admin.ErrNoLetter)
}

// A replay of a letter replayed meanwhile (a second click on a page read
// before the first finished) is refused, and leaves the bucket's next
// pending letter alone: it was selected by position before, handed in its
// place, and recorded as failed with a reason about the mix-up.
func TestReplayingALetterReplayedMeanwhileLeavesItsNeighbourAlone(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	var letters []eventsource.DeadLetter
	for _, i := range []int{0, 1} {
		d, err := f.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "orders", Bucket: 0,
			EventID: f.events[i].ID, Reason: "boom", Attempts: 1})
		require.NoError(t, err)
		letters = append(letters, d)
	}
	handled := 0
	handle := func(context.Context, eventsource.RecordedEvent) error { handled++; return nil }
	stale, err := admin.Letter(ctx, f.store, "orders", letters[0].EventID, false)
	require.NoError(t, err)
	require.NoError(t, admin.Replay(ctx, f.store, stale, false, handle))
	refusal(t, admin.Replay(ctx, f.store, stale, false, handle), admin.Conflict, admin.ErrNotReplayed)
	require.Equal(t, 1, handled)
	next, err := f.store.DeadLetter(ctx, "orders", letters[1].EventID)
	require.NoError(t, err)
	require.Nil(t, next.ReplayedAt)
	require.Equal(t, [2]any{1, "boom"}, [2]any{next.Attempts, next.Reason})
}

// The claimant's load is counted as its pass counts it: a bucket it is
// handing over is not its own. The console's warning that a claimant at
// its share may withdraw counted it (leasestore.HandoffRequest.Load), so
// it warned of a withdrawal `kumi relinquish` (and the pass) knew would
// not happen.
func TestAClaimantsLoadLeavesOutTheBucketItIsHandingOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	a, b := f.join(t, "orders", "worker-a", 4), f.join(t, "orders", "worker-b", 4)
	for _, s := range []*leasestore.Store{a, b} {
		_, err := s.Pass(ctx)
		require.NoError(t, err)
	}
	snap, err := leasestore.ReadSnapshot(ctx, f.store.Pool(), f.schema, "orders")
	require.NoError(t, err)
	owned := map[string][]int{}
	for _, bk := range snap.Buckets {
		owned[bk.Owner] = append(owned[bk.Owner], bk.Bucket)
	}
	require.Len(t, owned["worker-a"], 2, "%v", owned)
	require.Len(t, owned["worker-b"], 2, "%v", owned)
	f.join(t, "orders", "worker-c", 4)
	// worker-a hands one of its two buckets over to worker-c ...
	_, err = admin.Relinquish(ctx, f.store, "orders", owned["worker-a"][0], "worker-c")
	require.NoError(t, err)
	// ... so a claim of one of worker-b's puts it at 2 of ceil(4/3) = 2,
	// not above: its pass keeps the claim.
	h, err := admin.Relinquish(ctx, f.store, "orders", owned["worker-b"][0], "worker-a")
	require.NoError(t, err)
	require.Equal(t, [3]int{3, 2, 1}, [3]int{h.Live, h.Share, h.Load})
	require.Equal(t, 2, h.HandoffRequest.Load, "leasestore's count, with the bucket handed over")
	require.False(t, h.AboveShare)
}
