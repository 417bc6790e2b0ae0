package actors

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// failCoordinator makes the group's coordinator fail once hold is closed
// (nil: at once), as a bug of its own would, and waits until its
// supervisor has restarted it and the new incarnation runs a reader for
// slot. The coordinator is busy with hold meanwhile: it runs no pass.
func (w *testWorker) failCoordinator(t *testing.T, slot int, hold <-chan struct{}) {
	t.Helper()
	var old *coordinator
	w.onCoordinator(t, func(c *coordinator) { old = c })
	w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(*coordinator) {
		if hold != nil {
			<-hold
		}
		panic(errors.New("test: the coordinator fails"))
	}))
	if hold != nil {
		return
	}
	w.awaitRestart(t, old, slot, 0)
}

// awaitRestart waits until the coordinator is another incarnation than old
// and runs a reader for slot, at an epoch other than not (0: any).
func (w *testWorker) awaitRestart(t *testing.T, old *coordinator, slot int, not int64) {
	t.Helper()
	restarted := false
	pgtest.Eventually(t, waitLong, func() bool {
		w.onCoordinator(t, func(c *coordinator) {
			ref := c.readers[slot]
			restarted = c != old && ref != nil && ref.epoch != not
		})
		return restarted
	}, "the coordinator is restarted and runs a reader for slot %d%s", slot, observed(w.diagnose))
}

// restartOpts is a one-bucket group whose reader writes no checkpoint
// while the test runs: every event it acks stays beyond the checkpoint.
func restartOpts(sub string, rec *recorder, lease leasestore.LeaseOptions) GroupOptions {
	o := groupOpts(sub, 1, rec, "w")
	o.Lease = lease
	o.CheckpointEvery, o.CheckpointInterval, o.HandlerTimeout = 10000, time.Hour, time.Hour
	return o
}

// A coordinator restarted by its supervisor stops its readers with it, and
// its first pass finds the buckets still held at the same epochs: nobody
// else held them meanwhile. Its readers start after what their
// predecessors handled, as readers spawned again by one coordinator do —
// not at the checkpoint. (Before, the coordinator kept what its readers
// handled in its own state, which the restart cleared: the new readers
// started at the checkpoint, and the worker delivered again, at the same
// epoch, every event acked since the last checkpoint write.)
func TestACoordinatorRestartRedeliversNothingItsReadersHandled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 5, 20)
	rec := newRecorder()
	// A lease that stays sure on a busy machine: the reader never stops
	// unsure (and writes its checkpoint as it drains).
	w := startWorker(t, schema, "w", restartOpts("corestart", rec,
		leasestore.LeaseOptions{TTL: 30 * time.Second, Heartbeat: time.Second, Margin: 10 * time.Second}))
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 20 }, "the 20 events handled (got %d)%s",
		observed(rec.distinct), observed(w.diagnose))
	cp, err := store.Checkpoint(ctx, "corestart", 0)
	require.NoError(t, err)
	require.Zero(t, cp, "no checkpoint written: the 20 events are acked beyond it")

	w.failCoordinator(t, 0, nil)
	seed(t, store, "acct", 5, 10)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 30 }, "every event handled after the restart (got %d)%s",
		observed(rec.distinct), observed(w.diagnose))
	require.Equal(t, "w@1", holders(t, schema, "corestart")[0], "held at one epoch throughout")
	require.Zero(t, rec.duplicates(), "events delivered again by the worker at the same epoch after its coordinator's restart")
	require.Equal(t, 30, deliveredTimes(rec), "deliveries")
}

// deliveredTimes is how many deliveries rec recorded.
func deliveredTimes(rec *recorder) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.total
}

// What a coordinator's readers handled counts for its restarted
// incarnation only at the same epoch. Here another worker takes the bucket
// (its lease lapsed while the coordinator was stuck) and leaves it before
// the coordinator fails and restarts: the restarted coordinator claims it
// at a new epoch, and its reader starts at the checkpoint — the other
// worker may have handled events beyond it — and delivers again the events
// acked here after the checkpoint (the crash row of docs/guarantees.md).
func TestACoordinatorRestartAfterAnotherWorkerHeldTheBucketStartsAtTheCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 5, 20)
	rec := newRecorder()
	w := startWorker(t, schema, "w", restartOpts("coretaken", rec, resizeLease()))
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 20 }, "the 20 events handled (got %d)%s",
		observed(rec.distinct), observed(w.diagnose))
	require.Equal(t, "w@1", holders(t, schema, "coretaken")[0])

	var old *coordinator
	w.onCoordinator(t, func(c *coordinator) { old = c })
	pid := w.readerOf(t, 0)
	hold := make(chan struct{})
	unhold := func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	}
	defer unhold()
	w.failCoordinator(t, 0, hold) // stuck: no pass renews the lease
	var acked int64
	w.onReader(t, pid, func(r *reader) { acked = r.acked() })
	cp, err := store.Checkpoint(ctx, "coretaken", 0)
	require.NoError(t, err)
	require.Less(t, cp, acked, "events acked beyond the checkpoint")

	other, err := leasestore.New(pgtest.Pool(t), leasestore.Config{Schema: schema, Subscription: "coretaken",
		Worker: "other", Buckets: 1, LeaseOptions: leasestore.LeaseOptions{TTL: 30 * time.Second, NoListen: true}})
	if err == nil {
		err = other.Start(ctx)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Stop(context.Background()) })
	pgtest.Eventually(t, waitLong, func() bool {
		res, err := other.Pass(ctx)
		require.NoError(t, err)
		return len(res.Owned) == 1
	}, "the other worker takes the bucket once w's lease lapsed (holders %v)", observed(func() map[int]string {
		return holders(t, schema, "coretaken")
	}))
	require.NoError(t, other.Leave(ctx))

	unhold()
	// A pass of the stuck coordinator that ended before it failed may
	// still report the bucket held at epoch 1, to the restarted one: the
	// reader spawned then (its fenced writes fail) is replaced once the
	// restarted coordinator's own pass lands.
	w.awaitRestart(t, old, 0, 1)
	held := holders(t, schema, "coretaken")[0]
	require.True(t, strings.HasPrefix(held, "w@") && held != "w@1", "claimed again at a new epoch: held by %s", held)
	seed(t, store, "acct", 5, 10)
	pgtest.Eventually(t, waitLong, func() bool { return deliveredTimes(rec) == 30+int(acked-cp) && rec.distinct() == 30 },
		"the events after the checkpoint delivered again, and the new ones (deliveries %d, distinct %d)%s",
		observed(func() int { return deliveredTimes(rec) }), observed(rec.distinct), observed(w.diagnose))
	require.Equal(t, int(acked-cp), rec.duplicates(), "events delivered again: those acked beyond the checkpoint")
}

// The event with the handler when the coordinator fails is given up as its
// readers stop, and the restarted coordinator's reader, at the same epoch,
// sends it at once as the retry it is — Attempt 1, with no event before it
// delivered again — as a reader restarted by its own supervisor does.
// (Before, the restarted coordinator's reader started at the checkpoint:
// it delivered again every event acked before it, and the event itself
// as a first attempt.)
func TestACoordinatorRestartSendsTheEventInFlightAgainAsARetry(t *testing.T) {
	t.Parallel()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 20) // one stream: delivered in position order
	const heldAt = 15
	var mu sync.Mutex
	attempts := map[int64][]int{} // by position
	held := make(chan struct{})
	o := restartOpts("coreflight", newRecorder(),
		leasestore.LeaseOptions{TTL: 30 * time.Second, Heartbeat: time.Second, Margin: 10 * time.Second})
	o.Handler = actor.PropsFromFunc(func(ctx actor.Context) {
		d, ok := ctx.Message().(*Delivery)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		p := d.Event.Position
		attempts[p] = append(attempts[p], d.Attempt)
		if p == heldAt && len(attempts[p]) == 1 {
			close(held) // left unanswered: the handler is busy with it
			return
		}
		ctx.Respond(Ack{})
	})
	w := startWorker(t, schema, "w", o)
	select {
	case <-held:
	case <-time.After(waitLong):
		t.Fatalf("event %d not delivered%s", heldAt, w.diagnose())
	}

	w.failCoordinator(t, 0, nil)
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts[20]) > 0
	}
	pgtest.Eventually(t, waitLong, done, "every event delivered after the restart%s", observed(w.diagnose))
	mu.Lock()
	defer mu.Unlock()
	for p := int64(1); p <= 20; p++ {
		want := []int{0}
		if p == heldAt {
			want = []int{0, 1}
		}
		require.Equal(t, want, attempts[p], "the attempts delivered of the event at position %d", p)
	}
}

// A pass of a failed coordinator that ends after the failure and before
// the supervisor restarts it posts its result to the same PID. The new
// incarnation took it for its own: it owned what its predecessor's pass
// found, stopped and spawned readers by it, and cleared the flag of its
// own pass under way (two passes then ran at once). Here such a late
// result — the slot at an epoch no pass of the new incarnation reported —
// is posted to the restarted coordinator: it is ignored.
func TestARestartedCoordinatorIgnoresItsPredecessorsPass(t *testing.T) {
	t.Parallel()
	_, schema := newTestStore(t)
	rec := newRecorder()
	w := startWorker(t, schema, "w", restartOpts("foreign-pass", rec, fastLease()))
	var old *coordinator
	pgtest.Eventually(t, waitLong, func() bool {
		w.onCoordinator(t, func(c *coordinator) { old = c; _ = c.readers[0] })
		return len(w.owned()) == 1
	}, "w holds the bucket%s", observed(w.diagnose))
	w.failCoordinator(t, 0, nil)

	var held leasestore.Lease
	var late *passDone
	w.onCoordinator(t, func(c *coordinator) {
		held = c.plan.Owned[0]
		sctx, span := c.g.telemetry.startReconcile(context.Background())
		stale := held
		stale.Epoch = held.Epoch + 41
		late = &passDone{inc: old, res: leasestore.PassResult{Owned: []leasestore.Lease{stale}}, ctx: sctx, span: span,
			start: time.Now()}
	})
	w.sys.Root.Send(w.group.coordinator, late)
	var owned leasestore.Lease
	var reader int64
	w.onCoordinator(t, func(c *coordinator) {
		owned = c.plan.Owned[0]
		if ref := c.readers[0]; ref != nil {
			reader = ref.epoch
		}
	})
	require.Equal(t, held.Epoch, owned.Epoch, "the slot is owned at the epoch the new incarnation's pass found, not its predecessor's late one")
	require.Equal(t, held.Epoch, reader, "the slot's reader runs at that epoch")
}

// A reader that stops on a lost fence after its slot was claimed again at
// a newer epoch (an old reader still draining when the claim came) told
// the coordinator only the slot: the coordinator dropped the lease held
// now from what it owns, until the next pass, and a sync meanwhile
// stopped the new epoch's reader. The message now names the reader's
// epoch, and only a loss at the epoch held forgets the lease.
func TestALostFenceOfAnOlderEpochLeavesTheLeaseHeldNow(t *testing.T) {
	t.Parallel()
	_, schema := newTestStore(t)
	rec := newRecorder()
	w := startWorker(t, schema, "w", restartOpts("older-fence", rec, fastLease()))
	pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 1 }, "w holds the bucket%s", observed(w.diagnose))
	var before, older, now leasestore.Lease
	var keptOlder, keptNow bool
	w.onCoordinator(t, func(c *coordinator) {
		before = c.plan.Owned[0]
		c.plan.LostFence(0, before.Epoch-1)
		older, keptOlder = c.plan.Owned[0]
		c.plan.LostFence(0, before.Epoch)
		now, keptNow = c.plan.Owned[0]
	})
	require.True(t, keptOlder, "a lost fence at epoch %d leaves the lease held at %d", before.Epoch-1, before.Epoch)
	require.Equal(t, before.Epoch, older.Epoch)
	require.False(t, keptNow, "a lost fence at the epoch held forgets the lease until a pass reports it: %+v", now)
}
