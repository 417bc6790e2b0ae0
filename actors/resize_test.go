package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
)

// exactlyOnceHandler records each delivery and commits it through
// CommitWithCheckpoint into the projection: the recorder shows order and
// overlaps, the projection effects committed more than once.
// deliveries records who delivered each event, to judge its duplicates.
type deliveries struct {
	mu sync.Mutex
	by map[uuid.UUID][]delivered
}

// delivered is one delivery: by which holding of which slot.
type delivered struct {
	worker                      string
	generation, bucket, attempt int
	epoch, position             int64
}

func (ds *deliveries) add(worker string, d *Delivery) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.by[d.Event.ID] = append(ds.by[d.Event.ID], delivered{worker: worker, generation: d.Generation, bucket: d.Bucket,
		attempt: d.Attempt, epoch: d.Epoch, position: d.Event.Position})
}

// badDuplicates lists the events delivered more than once other than as
// docs/guarantees.md allows under a lease loss (the machine this runs on
// may starve a pass past the TTL): every duplicate must come from two
// holdings of the same slot — a later holding repeating what an earlier
// one acked after its last checkpoint. An event delivered by two
// generations (the cut crossed) or twice by one holding is a fault.
func (ds *deliveries) badDuplicates() (bad []string, allowed int) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for id, l := range ds.by {
		for i := 1; i < len(l); i++ {
			a, b := l[i-1], l[i]
			switch {
			case a.generation != b.generation:
				bad = append(bad, fmt.Sprintf("event %s (position %d) delivered by generations %d and %d", id, a.position, a.generation, b.generation))
			case a.worker == b.worker && a.epoch == b.epoch && b.attempt == 0:
				bad = append(bad, fmt.Sprintf("event %s (position %d) delivered twice by %s at epoch %d", id, a.position, a.worker, a.epoch))
			default:
				allowed++
			}
		}
	}
	return bad, allowed
}

// exactlyOnceHandler commits each delivery with its checkpoint: as a
// function handler when fn (which takes runs of events one at a time, see
// funcrun.go: a run must stop at the reader's resize bound), else as an
// actor that answers each delivery.
func exactlyOnceHandler(rec *recorder, ds *deliveries, proj *projection, worker string, fn bool) *actor.Props {
	handle := func(ctx context.Context, d *Delivery) error {
		ds.add(worker, d)
		rec.begin(worker, d.Event)
		err := CommitWithCheckpoint(ctx, proj.store, d, proj.apply(d))
		rec.end(worker, d.Event)
		return err
	}
	if fn {
		return Func(handle)
	}
	return actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			ctx.Respond(answer(handle(d.Context, d)))
		}
	})
}

// resizeLease is fastLease with room for a loaded machine: a resize runs
// many passes, and a lease lapsing under load only slows it down.
func resizeLease() leasestore.LeaseOptions {
	return leasestore.LeaseOptions{TTL: 6 * time.Second, Heartbeat: 500 * time.Millisecond, Margin: 1500 * time.Millisecond}
}

// appender appends to streams of category until stopped, one event at a
// time, round-robin over streams, and counts what it appended. It paces
// itself on the group: it appends only while pace, given how many it has
// appended, says the group has delivered enough of them — so that what is
// left to deliver when it stops stays bounded on a loaded machine, where
// the group delivers slower than one appender appends.
type appender struct {
	n    atomic.Int64
	stop chan struct{}
	done chan error
}

// behind paces an appender: it may append while fewer than ahead of the
// events (seeded before it started, and its own) are still to deliver.
func behind(rec *recorder, seeded, ahead int) func(appended int64) bool {
	return func(appended int64) bool { return seeded+int(appended)-rec.distinct() < ahead }
}

func startAppender(t *testing.T, store *eventsource.Store, category string, streams int, pace func(appended int64) bool) *appender {
	a := &appender{stop: make(chan struct{}), done: make(chan error, 1)}
	stopped := func() bool {
		select {
		case <-a.stop:
			return true
		default:
			return false
		}
	}
	go func() {
		for i := 0; ; i++ {
			pgtest.WaitFor(time.Hour, func() bool { return stopped() || pace(a.n.Load()) })
			if stopped() {
				a.done <- nil
				return
			}
			if _, err := store.Append(context.Background(), fmt.Sprintf("%s-%d", category, i%streams), eventsource.Any,
				[]eventsource.EventData{{Type: "Live", Data: []byte(fmt.Sprintf(`{"i":%d}`, i))}}); err != nil {
				a.done <- err
				return
			}
			a.n.Add(1)
		}
	}()
	t.Cleanup(a.end)
	return a
}

// end stops the appender once and returns its error.
func (a *appender) end() {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
}

// resizeTo resizes and waits for the new generation, recording the states
// it passed through. It waits as long as the resize progresses (see
// eventuallyProgressing): its state, a bucket's proposal, drain or
// readiness, or an old bucket's checkpoint moving towards the cut. Its
// failure describes the resize and every worker's readers (ws).
func resizeTo(t *testing.T, store *eventsource.Store, sub string, m int, ws ...*testWorker) (leasestore.Resize, []leasestore.ResizeState) {
	t.Helper()
	ctx := context.Background()
	r, err := Resize(ctx, store, sub, m, ResizeOptions{By: "test"})
	require.NoError(t, err, "resize to %d", m)
	id := r.ID
	states := []leasestore.ResizeState{r.State}
	var readErr error
	read := func() bool {
		r, readErr = leasestore.ReadResize(ctx, store.Pool(), store.Schema(), sub)
		if readErr != nil {
			return true // reported below
		}
		if states[len(states)-1] != r.State {
			states = append(states, r.State)
		}
		return r.ID != id || !r.Resizing()
	}
	eventuallyProgressing(t, stallFor, progressCap, read, changes(func() string { return resizeProgress(store, sub) }),
		func() string {
			var b strings.Builder
			fmt.Fprintf(&b, "\nresize now: %+v", r)
			for i, w := range ws {
				if i == 0 {
					b.WriteString(w.diagnose())
				} else {
					b.WriteString(w.diagnoseProcess())
				}
			}
			return b.String()
		}, "resize %d to %d ends (passed through %v)", id, m, observed(func() []leasestore.ResizeState { return states }))
	require.NoError(t, readErr)
	require.Equal(t, id, r.ID, "no other resize ran")
	require.Equal(t, m, r.Buckets, "the resize completed (passed through %v)", states)
	require.Equal(t, leasestore.ResizeSteady, r.State)
	return r, states
}

// resizeProgress is what moves while a resize progresses: its state, its
// buckets' proposals, drains and readiness, and the checkpoints of the generation it drains (each
// old bucket's reader delivers up to the cut before it drains).
func resizeProgress(store *eventsource.Store, sub string) string {
	ctx := context.Background()
	r, err := leasestore.ReadResize(ctx, store.Pool(), store.Schema(), sub)
	if err != nil {
		return err.Error()
	}
	cps, err := store.Checkpoints(ctx, sub)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", r.ID, r.State)
	for _, s := range append(r.Old, r.New...) {
		// Not its owner or epoch: leases that change hands on a starved
		// machine are no progress.
		fmt.Fprintf(&b, " %d:%d/%v/%v", s.Slot, s.Proposal, s.Drained, s.Ready)
	}
	for _, c := range cps {
		if g, _ := eventsource.SlotBucket(c.Bucket); g == r.Generation {
			fmt.Fprintf(&b, " %d:%d", c.Bucket, c.Position)
		}
	}
	return b.String()
}

// Resize up and down while three workers run and an appender appends:
// every event delivered, its effect committed exactly once, every stream
// in order across both changes, no stream handled by two workers at once,
// no event delivered by two generations; the old generations' checkpoints
// end at their cuts.
func TestResizeUpAndDownInProcess(t *testing.T) {
	t.Parallel()
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, schema := newTestStore(t)
			proj := newProjection(t, store, schema)
			rec := newRecorder()
			ds := &deliveries{by: map[uuid.UUID][]delivered{}}
			seed(t, store, "acct", 24, 200)
			var ws []*testWorker
			for i := range 3 {
				name := fmt.Sprintf("w%d", i)
				opts := groupOpts("resize-"+kind.String(), 4, rec, name)
				opts.Lease = resizeLease()
				opts.Handler = exactlyOnceHandler(rec, ds, proj, name, kind == leasestore.KindSession)
				opts.Lease.Kind = kind
				ws = append(ws, startWorker(t, schema, name, opts))
			}
			pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() >= 100 }, "the group delivers")
			app := startAppender(t, store, "acct", 24, behind(rec, 200, 300))

			sub := "resize-" + kind.String()
			up, states := resizeTo(t, store, sub, 12, ws...)
			require.Equal(t, 1, up.Generation)
			t.Logf("4 → 12 passed through %v", states)
			down, states := resizeTo(t, store, sub, 3, ws...)
			require.Equal(t, 2, down.Generation)
			t.Logf("12 → 3 passed through %v", states)

			app.end()
			require.NoError(t, <-app.done)
			total := 200 + int(app.n.Load())
			drainStart, left := time.Now(), total-rec.distinct()
			waitDelivered(t, store, sub, "acct", rec, total, []int{4, 12, 3}, ws...)
			t.Logf("the last %d events delivered in %v", left, time.Since(drainStart).Round(time.Millisecond))
			rec.mu.Lock()
			require.Empty(t, rec.order, "per-stream order across the resizes")
			require.Empty(t, rec.overlaps, "no stream handled by two workers at once")
			rec.mu.Unlock()
			bad, allowed := ds.badDuplicates()
			require.Empty(t, bad, "no duplicate but a lease loss's")
			t.Logf("duplicates after lease losses on this machine: %d", allowed)
			n, over := proj.counts(t)
			require.Equal(t, total, n)
			require.Zero(t, over, "every effect committed once")

			// The retired generations' checkpoints: all at their cuts; the
			// serving one's above the second cut.
			cps, err := store.Checkpoints(ctx, sub)
			require.NoError(t, err)
			byGen := map[int][]int64{}
			for _, c := range cps {
				g, _ := eventsource.SlotBucket(c.Bucket)
				byGen[g] = append(byGen[g], c.Position)
			}
			require.Len(t, byGen[0], 4)
			require.Len(t, byGen[1], 12)
			require.Len(t, byGen[2], 3)
			for g := range 2 {
				for _, p := range byGen[g] {
					require.Equal(t, byGen[g][0], p, "generation %d ended at one cut", g)
				}
			}
			require.Less(t, byGen[0][0], byGen[1][0], "the second cut is after the first")
			for _, w := range ws {
				st, err := w.group.Status(ctx)
				require.NoError(t, err)
				require.Equal(t, 3, st.Buckets)
				require.Equal(t, 2, st.Generation)
				for _, b := range st.Owned {
					require.Equal(t, 2, b.Generation)
					require.Equal(t, eventsource.Slot(2, b.Bucket), b.Slot)
				}
			}
		})
	}
}

// gate blocks the handling of one stream's events until opened.
type gate struct {
	stream string
	in     chan struct{} // closed when a blocked event reached the handler
	inOnce sync.Once
	open   chan struct{}
}

// handler is an actor handler for worker that records each delivery,
// held back by the gate when it is of the gate's stream.
func (g *gate) handler(rec *recorder, worker string) *actor.Props {
	return actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			rec.begin(worker, d.Event)
			g.wait(d)
			rec.end(worker, d.Event)
			ctx.Respond(Ack{})
		}
	})
}

func (g *gate) wait(d *Delivery) {
	if d.Event.Stream != g.stream {
		return
	}
	g.inOnce.Do(func() { close(g.in) })
	select {
	case <-g.open:
	case <-d.Context.Done():
	}
}

// A resize cancelled in state cut, with some old buckets drained and one
// held back by a slow handler (4 → 5: every new bucket waits for every old
// one, so the resize cannot switch): a second resize meanwhile is refused,
// the cancel puts everything back — the drained buckets are served again
// from the cut — and every event is delivered exactly once, in order.
func TestCancelResizeUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	seed(t, store, "acct", 8, 80)
	g := &gate{stream: "acct-3", in: make(chan struct{}), open: make(chan struct{})}
	// One worker: no handoff of the held-back bucket (a handoff would wait
	// for its handler, past the lease).
	var ws []*testWorker
	for i := range 1 {
		name := fmt.Sprintf("w%d", i)
		opts := groupOpts("cancel", 4, rec, name)
		opts.Lease = resizeLease()
		opts.HandlerTimeout = waitLong
		opts.Handler = g.handler(rec, name)
		ws = append(ws, startWorker(t, schema, name, opts))
	}
	<-g.in // one bucket is held back
	app := startAppender(t, store, "acct", 8, behind(rec, 80, 200))

	r, err := Resize(ctx, store, "cancel", 5, ResizeOptions{By: "test"})
	require.NoError(t, err)
	require.Equal(t, leasestore.ResizeSealing, r.State)
	waitResize(t, store, "cancel", rec, func(r leasestore.Resize) bool {
		return r.State == leasestore.ResizeCut && countDrained(r.Old) == 3
	}, ws, "the cut decided, three old buckets drained, the held-back one not")

	_, err = Resize(ctx, store, "cancel", 6, ResizeOptions{})
	var inProgress *leasestore.ResizeInProgressError
	require.ErrorAs(t, err, &inProgress, "a second resize is refused")
	require.Equal(t, 5, inProgress.To)

	r, err = CancelResize(ctx, store, "cancel")
	require.NoError(t, err)
	require.Equal(t, leasestore.ResizeSteady, r.State)
	require.Equal(t, 0, r.Generation)
	require.Equal(t, 4, r.Buckets)
	_, err = CancelResize(ctx, store, "cancel")
	require.ErrorIs(t, err, leasestore.ErrNoResize)

	close(g.open)
	pgtest.Eventually(t, waitLong, func() bool {
		n := 0
		for _, w := range ws {
			n += len(w.owned())
		}
		return n == 4
	}, "the drained buckets are served again")
	app.end()
	require.NoError(t, <-app.done)
	total := 80 + int(app.n.Load())
	waitDelivered(t, store, "cancel", "acct", rec, total, []int{4, 5}, ws...)
	rec.mu.Lock()
	require.Empty(t, rec.order)
	require.Empty(t, rec.overlaps)
	rec.mu.Unlock()
	require.Zero(t, rec.duplicates(), "a cancel repeats nothing")
	for _, w := range ws {
		for _, b := range w.owned() {
			require.Less(t, b, 4, "only generation 0's buckets")
		}
	}
}

// Resize refuses what it cannot do, typed, before writing anything.
func TestResizeRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	startWorker(t, schema, "w", groupOpts("refuse", 4, rec, "w"))
	for _, m := range []int{0, -1, leasestore.MaxBuckets + 1} {
		_, err := Resize(ctx, store, "refuse", m, ResizeOptions{})
		var cfg *kumierr.ConfigError
		require.ErrorAs(t, err, &cfg, "buckets %d", m)
		require.Equal(t, "actors buckets", cfg.Field)
	}
	_, err := Resize(ctx, store, "refuse", 4, ResizeOptions{})
	require.ErrorIs(t, err, leasestore.ErrSameBuckets)
	_, err = Resize(ctx, store, "nobody", 8, ResizeOptions{})
	require.ErrorIs(t, err, leasestore.ErrNoSubscription)
	_, err = CancelResize(ctx, store, "refuse")
	require.ErrorIs(t, err, leasestore.ErrNoResize)
	r, err := leasestore.ReadResize(ctx, store.Pool(), schema, "refuse")
	require.NoError(t, err)
	require.Equal(t, leasestore.ResizeSteady, r.State)
	require.Equal(t, 4, r.Buckets)

	// A waiting Resize whose context ends leaves the resize running.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = FollowResize(cctx, store, leasestore.Resize{Subscription: "refuse", State: leasestore.ResizeSealing}, ResizeOptions{})
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
}

// A worker started with the old Buckets after a resize (a rolling deploy
// with stale options) serves the database's generation: no error, it takes
// its share of the new buckets, and delivers.
func TestOldBucketsOptionAfterAResize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	seed(t, store, "acct", 8, 40)
	a := startWorker(t, schema, "a", withLease(groupOpts("stale", 4, rec, "a"), resizeLease()))
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 40 }, "the first worker delivers")
	r, _ := resizeTo(t, store, "stale", 6, a)
	require.Equal(t, 1, r.Generation)

	b := startWorker(t, schema, "b", withLease(groupOpts("stale", 4, rec, "b"), resizeLease()))
	pgtest.Eventually(t, waitLong, func() bool { return len(a.owned()) == 3 && len(b.owned()) == 3 },
		"the six buckets split between the two")
	seed(t, store, "acct", 8, 40)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 80 }, "both deliver")
	st, err := b.group.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, st.Buckets, "the database's count, not the option's")
	require.Equal(t, 1, st.Generation)
	for _, o := range st.Owned {
		require.Equal(t, 1, o.Generation)
		require.Less(t, o.Bucket, 6)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Empty(t, rec.order)
}

func withLease(o GroupOptions, l leasestore.LeaseOptions) GroupOptions {
	o.Lease = l
	return o
}

// A waiting Resize follows its own resize, not whichever runs: cancelled
// while it follows, and another resize requested and completed before its
// next read, it returns ErrResizeCancelled, not the other's success (the
// subscription steady at the next generation, with the other's count).
func TestAWaitingResizeDoesNotTakeAnothersForItsOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	seed(t, store, "acct", 8, 40)
	startWorker(t, schema, "w", withLease(groupOpts("theirs", 4, rec, "w"), resizeLease()))
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 40 }, "the worker delivers")

	var once sync.Once
	var other leasestore.Resize
	var otherErr error
	r, err := Resize(ctx, store, "theirs", 8, ResizeOptions{Wait: true, By: "mine", Poll: 10 * time.Millisecond,
		Progress: func(leasestore.Resize) {
			// Within one poll: someone cancels this resize and resizes to 6,
			// which completes.
			once.Do(func() {
				if _, otherErr = CancelResize(ctx, store, "theirs"); otherErr != nil {
					return
				}
				other, otherErr = Resize(ctx, store, "theirs", 6, ResizeOptions{Wait: true, By: "theirs",
					Poll: 10 * time.Millisecond})
			})
		}})
	require.NoError(t, otherErr)
	require.Equal(t, 6, other.Buckets, "the other resize completed")
	require.ErrorIs(t, err, ErrResizeCancelled, "the resize followed was cancelled; got %+v", r)
}
