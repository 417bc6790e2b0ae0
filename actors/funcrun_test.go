package actors

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// runFixture runs a function handler's run outside a reader: the run's
// answer comes out of answers.
type runFixture struct {
	t       *testing.T
	sys     *actor.ActorSystem
	answers chan *handlerReply
	pid     *actor.PID
}

func newRunFixture(t *testing.T) *runFixture {
	f := &runFixture{t: t, sys: quietSystem(), answers: make(chan *handlerReply, 4)}
	f.pid = f.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*handlerReply); ok {
			f.answers <- m
		}
	}))
	t.Cleanup(func() { require.NoError(t, f.sys.Root.StopFuture(f.pid).Wait()) })
	return f
}

// start runs fn over events at positions 1..n; the returned channel closes
// when the handler is done with the run.
func (f *runFixture) start(n int, held func(int) error, fn HandlerFunc) (*run, chan struct{}) {
	evs := make([]eventsource.RecordedEvent, n)
	for i := range evs {
		evs[i] = eventsource.RecordedEvent{ID: uuid.New(), Stream: "acct-1", Position: int64(i + 1), Version: int64(i)}
	}
	ru := &run{d: &Delivery{Event: evs[0], Attempt: 2, replyTo: f.pid, exclusive: true}, events: evs,
		held: held, tel: &telemetry{}, until: time.Now().Add(time.Hour), limit: math.MaxInt64}
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&funcHandler{fn: fn}).handle(f.sys.Root, ru)
	}()
	return ru, done
}

func held(int) error { return nil }

func TestFunctionHandlerRunUnits(t *testing.T) {
	t.Parallel()

	t.Run("ACutRunAnswersAfterTheEventInHand", func(t *testing.T) {
		t.Parallel()
		f := newRunFixture(t)
		reached, release := make(chan struct{}), make(chan struct{})
		ru, done := f.start(10, held, func(_ context.Context, d *Delivery) error {
			if d.Event.Position == 3 {
				close(reached)
				<-release
			}
			return nil
		})
		<-reached
		ru.cutShort()
		close(release)
		m := <-f.answers
		<-done
		require.Same(t, ru, m.msg)
		require.Equal(t, 2, m.attempt, "tagged with the run's first delivery")
		o := ru.end()
		require.Equal(t, 3, o.done, "the event in hand finished, none started after it")
		require.Nil(t, o.next)
		require.False(t, o.inHand)
	})

	// The reader gives a run in flight each new resize bound (limitRuns):
	// the run starts no event beyond it.
	t.Run("ARunStartsNoEventBeyondTheBoundItIsGiven", func(t *testing.T) {
		t.Parallel()
		f := newRunFixture(t)
		reached, release := make(chan struct{}), make(chan struct{})
		var last atomic.Int64
		ru, done := f.start(10, held, func(_ context.Context, d *Delivery) error {
			last.Store(d.Event.Position)
			if d.Event.Position == 3 {
				close(reached)
				<-release
			}
			return nil
		})
		<-reached
		ru.mu.Lock()
		ru.limit = 5
		ru.mu.Unlock()
		close(release)
		<-f.answers
		<-done
		o := ru.end()
		require.Equal(t, 5, o.done, "the events up to the bound acked")
		require.Equal(t, int64(5), last.Load(), "none handled beyond it")
		require.Nil(t, o.next)
		require.NoError(t, o.unsure)
	})

	t.Run("ARunEndedByTheReaderCancelsTheEventInHandAndAnswersNothing", func(t *testing.T) {
		t.Parallel()
		f := newRunFixture(t)
		reached := make(chan context.Context, 1)
		var calls atomic.Int64
		ru, done := f.start(10, held, func(ctx context.Context, d *Delivery) error {
			calls.Add(1)
			if d.Event.Position == 4 {
				reached <- ctx
				<-ctx.Done()
			}
			return nil
		})
		ctx := <-reached
		o := ru.end()
		require.Equal(t, 3, o.done)
		require.True(t, o.inHand, "the reader times out the event in hand")
		<-ctx.Done()
		<-done
		require.Equal(t, int64(4), calls.Load(), "no event started after the run ended")
		require.Empty(t, f.answers, "a run the reader ended answers nothing")
	})

	t.Run("AnEventNotAckedEndsTheRunWithItsAnswerAndAttempt", func(t *testing.T) {
		t.Parallel()
		f := newRunFixture(t)
		var attempts []int
		ru, done := f.start(10, held, func(_ context.Context, d *Delivery) error {
			attempts = append(attempts, d.Attempt)
			if d.Event.Position == 5 {
				panic("kaboom")
			}
			return nil
		})
		<-f.answers
		<-done
		o := ru.end()
		require.Equal(t, 4, o.done)
		require.Equal(t, []int{2, 0, 0, 0, 0}, attempts, "the first event's attempt is the slot's, the others' first")
		p, ok := o.next.(*handlerPanicked)
		require.True(t, ok, "%T", o.next)
		require.Contains(t, p.reason, "kaboom (in ")
	})

	t.Run("EnsureHeldIsCheckedBeforeEachEvent", func(t *testing.T) {
		t.Parallel()
		f := newRunFixture(t)
		lost := errors.New("lease unsure")
		var calls atomic.Int64
		ru, _ := f.start(10, func(int) error {
			if calls.Load() == 6 {
				return lost
			}
			return nil
		}, func(context.Context, *Delivery) error {
			calls.Add(1)
			return nil
		})
		<-f.answers
		o := ru.end()
		require.Equal(t, 6, o.done)
		require.ErrorIs(t, o.unsure, lost)
		require.Nil(t, o.next)
	})
}

func TestFunctionHandlerRuns(t *testing.T) {
	t.Parallel()

	t.Run("APanicInARunIsARetryWhoseDeadLetterSaysItPanicked", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 10)
		poison := appendOne(t, store, "acct-1", "Poison", `{}`)
		seed(t, store, "acct", 3, 10)
		var seen attempts
		rec := newRecorder()
		o := groupOpts("run-panic", 1, nil, "w")
		o.Retry = fastRetry(3)
		o.Handler = Func(func(_ context.Context, d *Delivery) error {
			seen.add(d.Event.ID)
			rec.begin("w", d.Event)
			if d.Event.Type == "Poison" {
				panic("kaboom")
			}
			rec.end("w", d.Event)
			return nil
		})
		startWorker(t, schema, "w", o)
		dl := waitDeadLetter(t, store, "run-panic", poison)
		require.Equal(t, 3, dl.Attempts)
		require.Contains(t, dl.Reason, "retry budget of 3 attempts spent; last: handler panicked: kaboom (in ")
		require.Equal(t, 3, seen.get(poison))
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 20 }, "every other event acked (got %d)", rec.distinct())
		require.Zero(t, rec.duplicates(), "the events before the poison were acked with it")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.order, "per-stream order")
	})

	t.Run("AHungEventInARunIsAbandonedAndRetriedAndTheEventsBeforeItAreAckedOnce", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 60)
		hang := make(chan struct{})
		cancelled := make(chan struct{})
		var once atomic.Bool
		var hungID atomic.Value
		var seen attempts
		rec := newRecorder()
		o := groupOpts("run-hung", 1, nil, "w")
		o.HandlerTimeout, o.Retry = 400*time.Millisecond, fastRetry(5)
		o.Handler = Func(func(ctx context.Context, d *Delivery) error {
			seen.add(d.Event.ID)
			if d.Event.Position > 30 && once.CompareAndSwap(false, true) {
				hungID.Store(d.Event.ID)
				<-ctx.Done() // given up on: its context is cancelled
				close(cancelled)
				<-hang // and still it does not return: the handler is replaced
				return nil
			}
			rec.begin("w", d.Event)
			rec.end("w", d.Event)
			return nil
		})
		startWorker(t, schema, "w", o)
		t.Cleanup(func() { close(hang) }) // before the worker's stop
		<-cancelled
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 60 }, "every event acked (got %d)", rec.distinct())
		require.Zero(t, rec.duplicates(), "the events the run finished before the hung one were acked, not sent again")
		require.Equal(t, 2, seen.get(hungID.Load().(uuid.UUID)), "the hung event was retried once")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.order, "per-stream order")
	})

	t.Run("AGracefulStopDuringARunLeavesTheRestToTheNextOwnerAndRepeatsNothing", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 100)
		reached, release := make(chan struct{}), make(chan struct{})
		var once atomic.Bool
		rec := newRecorder()
		handler := func(worker string) *actor.Props {
			return Func(func(_ context.Context, d *Delivery) error {
				rec.begin(worker, d.Event)
				if d.Event.Position > 50 && once.CompareAndSwap(false, true) {
					close(reached)
					<-release
				}
				rec.end(worker, d.Event)
				return nil
			})
		}
		oa := groupOpts("run-stop", 1, nil, "a")
		oa.Handler = handler("a")
		a := startWorker(t, schema, "a", oa)
		<-reached
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stopped <- a.rt.Stop(ctx)
		}()
		close(release)
		require.NoError(t, <-stopped)
		handledByA := rec.distinct()
		ob := groupOpts("run-stop", 1, nil, "b")
		ob.Handler = handler("b")
		startWorker(t, schema, "b", ob)
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 100 }, "b handles the rest (got %d)", rec.distinct())
		require.Zero(t, rec.duplicates(), "a graceful stop repeats nothing")
		require.GreaterOrEqual(t, handledByA, 51)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.order, "per-stream order")
		require.Empty(t, rec.overlaps)
	})
}

// runGate blocks a function handler's call for one event, the calls-th, in
// the middle of a run, and records every call: by which generation and
// holding, and whether it started while the test said the lease was unsure.
type runGate struct {
	calls   int64
	reached chan struct{} // closed when the gated call began
	release chan struct{}
	gated   atomic.Int64 // its position
	n       atomic.Int64 // calls so far
	unsure  atomic.Bool  // set by the test while the lease is unsure
	// startedUnsure counts the calls begun while unsure was set.
	startedUnsure atomic.Int64
}

func newRunGate(calls int64) *runGate {
	return &runGate{calls: calls, reached: make(chan struct{}), release: make(chan struct{})}
}

func (g *runGate) handler(rec *recorder, ds *deliveries, worker string) *actor.Props {
	return Func(func(ctx context.Context, d *Delivery) error {
		if g.unsure.Load() {
			g.startedUnsure.Add(1)
		}
		ds.add(worker, d)
		rec.begin(worker, d.Event)
		if g.n.Add(1) == g.calls {
			g.gated.Store(d.Event.Position)
			close(g.reached)
			<-g.release
		}
		rec.end(worker, d.Event)
		return nil
	})
}

// unsureLeaseOptions: usable for 2 s after a renewal, valid for 8 s, so
// that holding the worker's row (see holdWorkerRow) makes EnsureHeld fail
// well before the lease could lapse.
func unsureLeaseOptions() leasestore.LeaseOptions {
	return leasestore.LeaseOptions{TTL: 8 * time.Second, Heartbeat: 250 * time.Millisecond, Margin: 6 * time.Second}
}

// holdWorkerRow locks the worker's row: its passes (heartbeat and renewal)
// wait, and after TTL − Margin EnsureHeld fails, although the lease is
// still held. The returned function lets the passes go on.
func holdWorkerRow(t *testing.T, store *eventsource.Store, schema, sub, worker string) func() {
	t.Helper()
	ctx := context.Background()
	tx, err := store.Pool().Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{schema}.Sanitize()+`.lease_workers WHERE subscription = $1 AND worker = $2 FOR UPDATE`,
		sub, worker)
	require.NoError(t, err)
	var once sync.Once
	free := func() { once.Do(func() { require.NoError(t, tx.Rollback(ctx)) }) }
	t.Cleanup(free)
	return free
}

// interruptByUnsureLease makes the worker's lease on slot unsure while the
// gated call is in hand, lets that call finish, and waits until the reader
// has acked and written the checkpoint through it: the run was cut after
// the event in hand. It checks that no call began while the lease was
// unsure, then lets the worker renew.
func interruptByUnsureLease(t *testing.T, store *eventsource.Store, schema, sub string, w *testWorker, g *runGate, slot int) {
	t.Helper()
	ctx := context.Background()
	free := holdWorkerRow(t, store, schema, sub, w.name)
	pgtest.Eventually(t, waitLong, func() bool { return w.group.g.leases.EnsureHeld(slot) != nil }, "the lease becomes unsure")
	g.unsure.Store(true)
	close(g.release)
	var cp int64
	waitUntil(t, func() bool {
		var err error
		cp, err = store.Checkpoint(ctx, sub, slot)
		require.NoError(t, err)
		return cp == g.gated.Load()
	}, func() string {
		return fmt.Sprintf("the reader acks the run through the event in hand and flushes: checkpoint %d, event in hand %d", cp, g.gated.Load())
	})
	g.unsure.Store(false)
	require.Zero(t, g.startedUnsure.Load(), "no event was started after the lease became unsure")
	free()
}

// fenceLostSlots lists the slots of the fence-lost spans recorded.
func fenceLostSlots(spans *tracetest.InMemoryExporter) []int64 {
	var out []int64
	for _, s := range spansNamed(spans, obsname.SpanLeaseFenceLost) {
		for _, a := range s.Attributes {
			if a.Key == obsname.AttrBucket {
				out = append(out, a.Value.AsInt64())
			}
		}
	}
	return out
}

// waitUntil waits for cond, then fails with what observed says, evaluated
// after the wait.
func waitUntil(t *testing.T, cond func() bool, observed func() string) {
	t.Helper()
	if !pgtest.WaitFor(waitLong, cond) {
		t.Fatalf("not within %v: %s", waitLong, observed())
	}
}

func TestFunctionHandlerRunsAndLeasesAndResizes(t *testing.T) {
	t.Parallel()

	// A run in hand when the lease becomes unsure (EnsureHeld fails, as
	// before a zombie's next delivery): the event in hand finishes, no
	// other event of the run is started, the reader acks what was done,
	// writes its checkpoint and stops; the reader respawned once the lease
	// renews delivers the rest, and nothing twice.
	t.Run("ARunInterruptedByAnUnsureLeaseStartsNoFurtherEvent", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 60)
		rec, ds := newRecorder(), &deliveries{by: map[uuid.UUID][]delivered{}}
		g := newRunGate(10) // the first event goes alone, the 10th is in the first run
		o := groupOpts("run-unsure", 1, rec, "w")
		o.Lease, o.HandlerTimeout = unsureLeaseOptions(), 2*waitLong
		o.Handler = g.handler(rec, ds, "w")
		w := startWorker(t, schema, "w", o)
		<-g.reached
		interruptByUnsureLease(t, store, schema, "run-unsure", w, g, 0)
		waitUntil(t, func() bool { return rec.distinct() == 60 },
			func() string { return fmt.Sprintf("the respawned reader delivers the rest: %d of 60", rec.distinct()) })
		require.Zero(t, rec.duplicates(), "nothing acked before the stop was delivered again")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.order, "per-stream order")
	})

	// A run must stop at the resize bound as single deliveries do. The
	// reader respawned after an unsure lease starts during a resize whose
	// cut C is decided, and its catch-up reads its whole bucket — events
	// beyond C included — before its first delivery: its runs must take
	// events up to C and no further. The events beyond C are the next
	// generation's, delivered once, by it; the runs of its buckets check
	// the lease of their reader's entry, and find it held.
	t.Run("ARunStopsAtTheResizeBound", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 60)
		rec, ds := newRecorder(), &deliveries{by: map[uuid.UUID][]delivered{}}
		g := newRunGate(10)
		o := groupOpts("run-bound", 1, rec, "w")
		o.Lease, o.HandlerTimeout = unsureLeaseOptions(), 2*waitLong
		o.Handler = g.handler(rec, ds, "w")
		tel, spans := spanRecorder(t)
		w := startTracedWorker(t, schema, "w", o, tel)
		<-g.reached

		// The cut is decided while the run is in hand: the bucket's one
		// reader proposes at once (frozen at its cursor).
		_, err := Resize(ctx, store, "run-bound", 2, ResizeOptions{By: "test"})
		require.NoError(t, err)
		var r leasestore.Resize
		waitUntil(t, func() bool {
			r, err = leasestore.ReadResize(ctx, store.Pool(), schema, "run-bound")
			require.NoError(t, err)
			return r.CutDecided
		}, func() string { return fmt.Sprintf("the cut decided: %+v", r) })
		cut := r.Cut
		seed(t, store, "acct", 3, 30) // beyond the cut
		var beyond []eventsource.RecordedEvent
		waitUntil(t, func() bool {
			beyond, err = store.ReadBucketBounded(ctx, "acct", 0, 1, cut, 100, 0)
			require.NoError(t, err)
			return len(beyond) == 30
		}, func() string { return fmt.Sprintf("the events beyond the cut sequenced: %d of 30", len(beyond)) })
		last := beyond[len(beyond)-1].Position
		// The runtime's publisher has read them: the respawned reader's
		// catch-up covers them (see readfeed.Feed.Paused).
		waitUntil(t, func() bool { return w.rt.published.Load() >= last },
			func() string { return fmt.Sprintf("the publisher at %d, not through %d", w.rt.published.Load(), last) })

		interruptByUnsureLease(t, store, schema, "run-bound", w, g, 0)
		waitUntil(t, func() bool { return rec.distinct() == 90 },
			func() string { return fmt.Sprintf("every event delivered: %d of 90", rec.distinct()) })
		waitUntil(t, func() bool {
			r, err = leasestore.ReadResize(ctx, store.Pool(), schema, "run-bound")
			require.NoError(t, err)
			return r.State == leasestore.ResizeSteady && r.Buckets == 2
		}, func() string { return fmt.Sprintf("the resize completes: %+v", r) })

		for _, slot := range fenceLostSlots(spans) {
			require.Zero(t, slot, "the only lease found unsure is the old bucket's (slot 0), by the test")
		}
		ds.mu.Lock()
		defer ds.mu.Unlock()
		for id, l := range ds.by {
			require.Len(t, l, 1, "event %s (position %d) delivered once: %+v", id, l[0].position, l)
			d := l[0]
			if d.position <= cut {
				require.Equal(t, 0, d.generation, "position %d, at or before the cut %d", d.position, cut)
			} else {
				require.Equal(t, 1, d.generation, "position %d, beyond the cut %d: the next generation's", d.position, cut)
			}
		}
		cp, err := store.Checkpoint(ctx, "run-bound", 0)
		require.NoError(t, err)
		require.Equal(t, cut, cp, "the old bucket drained to the cut")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.order, "per-stream order")
	})

	// A takeover in the middle of a run: worker a is frozen (its passes
	// hang) with an event of a run in hand, b takes the bucket and commits
	// every effect with its checkpoint; when a wakes, the event in hand's
	// commit is refused by the fence, and the run starts no further event
	// (its lease check fails): every effect committed once.
	t.Run("ATakeoverMidRunCommitsEachEffectOnce", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		proj := newProjection(t, store, schema)
		seed(t, store, "acct", 3, 60)
		rec := newRecorder()
		g := newRunGate(10)
		handle := func(worker string, gate *runGate) *actor.Props {
			return Func(func(ctx context.Context, d *Delivery) error {
				if gate != nil {
					if gate.unsure.Load() {
						gate.startedUnsure.Add(1)
					}
					if gate.n.Add(1) == gate.calls {
						close(gate.reached)
						<-gate.release
						gate.unsure.Store(true) // woken: a holds nothing any more
					}
				}
				rec.begin(worker, d.Event)
				err := CommitWithCheckpoint(ctx, proj.store, d, proj.apply(d))
				rec.end(worker, d.Event)
				return err
			})
		}
		oa := groupOpts("run-zombie", 1, nil, "a")
		oa.Handler = handle("a", g)
		tel, spans := spanRecorder(t)
		startTracedWorker(t, schema, "a", oa, tel)
		<-g.reached
		free := holdWorkerRow(t, store, schema, "run-zombie", "a")
		ob := groupOpts("run-zombie", 1, nil, "b")
		ob.Handler = handle("b", nil)
		startWorker(t, schema, "b", ob)
		var n, over int
		waitUntil(t, func() bool { n, over = proj.counts(t); return n == 60 },
			func() string { return fmt.Sprintf("b takes the bucket and commits every effect: %d of 60", n) })

		close(g.release) // a wakes
		waitUntil(t, func() bool { return len(spansNamed(spans, obsname.SpanLeaseFenceLost)) > 0 },
			func() string { return "a's reader stops on its lost lease: no fence-lost span" })
		require.Zero(t, g.startedUnsure.Load(), "a started no event after waking")
		free()
		n, over = proj.counts(t)
		require.Equal(t, 60, n)
		require.Zero(t, over, "every effect committed once")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.order, "per-stream order")
	})

	// A retry in the middle of a run: the events before it are acked once,
	// the event is retried before any later event is handled (one bucket,
	// MaxInFlight 1: the calls are in position order but for the retry,
	// which comes right after the failed attempt), and the events after it
	// are handled once each, in order.
	t.Run("ARetryInTheMiddleOfARunKeepsOrder", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 60)
		type call struct {
			pos     int64
			attempt int
		}
		var mu sync.Mutex
		var calls []call
		failed := false
		rec := newRecorder()
		o := groupOpts("run-retry", 1, rec, "w")
		o.Retry = fastRetry(5)
		o.Handler = Func(func(_ context.Context, d *Delivery) error {
			mu.Lock()
			calls = append(calls, call{d.Event.Position, d.Attempt})
			n := len(calls)
			fail := n == 30 && !failed
			failed = failed || fail
			mu.Unlock()
			rec.begin("w", d.Event)
			if fail {
				return errors.New("not yet")
			}
			rec.end("w", d.Event)
			return nil
		})
		startWorker(t, schema, "w", o)
		waitUntil(t, func() bool { return rec.distinct() == 60 },
			func() string { return fmt.Sprintf("every event acked: %d of 60", rec.distinct()) })
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, calls, 61, "each event once, the failed one twice: %v", calls)
		for i := 1; i < len(calls); i++ {
			prev, c := calls[i-1], calls[i]
			if i == 30 {
				require.Equal(t, call{prev.pos, 1}, c, "the failed event is retried next, attempt 1")
				continue
			}
			require.Equal(t, 0, c.attempt, "call %d", i)
			require.Greater(t, c.pos, prev.pos, "call %d: positions in order", i)
		}
		require.Zero(t, rec.duplicates())
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.Empty(t, rec.order, "per-stream order")
	})
}

// BenchmarkFunctionHandlerRun is a function handler's own work per event
// of a run, with a no-op function and a lease check that costs nothing:
// the Delivery, its span and counters (no tracer set), the run's state.
// It reports allocations per event (b.N counts events).
func BenchmarkFunctionHandlerRun(b *testing.B) {
	sys := quietSystem()
	sink := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	b.Cleanup(func() { _ = sys.Root.StopFuture(sink).Wait() })
	evs := make([]eventsource.RecordedEvent, maxRunEvents)
	for i := range evs {
		evs[i] = eventsource.RecordedEvent{ID: uuid.New(), Stream: "acct-1", Position: int64(i + 1)}
	}
	h := &funcHandler{fn: func(context.Context, *Delivery) error { return nil }}
	tel := newTelemetry(nil, testLoggerOrDiscard())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += len(evs) {
		ru := &run{d: &Delivery{Event: evs[0], replyTo: sink, exclusive: true}, events: evs[:min(len(evs), b.N-i)],
			held: held, tel: tel, until: time.Now().Add(time.Hour), limit: math.MaxInt64}
		h.handle(sys.Root, ru)
	}
}
