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
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// attempts counts deliveries per event id.
type attempts struct {
	mu sync.Mutex
	n  map[uuid.UUID]int
}

func (a *attempts) add(id uuid.UUID) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[uuid.UUID]int{}
	}
	a.n[id]++
	return a.n[id]
}

func (a *attempts) get(id uuid.UUID) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[id]
}

func fastRetry(max int) RetryPolicy {
	return RetryPolicy{MaxAttempts: max, Backoff: supervision.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}}
}

func TestHandlerContract(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("APoisonEventIsRetriedThePolicysNumberOfTimesThenDeadLettered", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 5, 20)
		poison, err := store.Append(ctx, "acct-2", eventsource.Any, []eventsource.EventData{{Type: "Poison", Data: []byte(`{"poison":true}`)}})
		require.NoError(t, err)
		seed(t, store, "acct", 5, 20)
		var seen attempts
		acked := newRecorder()
		handler := actor.PropsFromFunc(func(ctx actor.Context) {
			if d, ok := ctx.Message().(*Delivery); ok {
				n := seen.add(d.Event.ID)
				if d.Event.Type == "Poison" {
					if testing.Verbose() {
						fmt.Printf("poison delivery %d attempt %d\n", n, d.Attempt)
					}
					ctx.Respond(Retry{Reason: "boom"})
					return
				}
				acked.end("w", d.Event)
				ctx.Respond(Ack{})
			}
		})
		o := groupOpts("poison", 2, nil, "w")
		o.Handler, o.Retry = handler, fastRetry(3)
		startWorker(t, schema, "w", o)
		pgtest.Eventually(t, waitLong, func() bool { return acked.distinct() == 40 }, "every other event acked (got %d)", observed(acked.distinct))
		var dl eventsource.DeadLetter
		pgtest.Eventually(t, waitLong, func() bool {
			dl, err = store.DeadLetter(ctx, "poison", poison.IDs[0])
			return err == nil
		}, "the poison event is dead-lettered")
		require.Equal(t, 3, dl.Attempts)
		require.Contains(t, dl.Reason, "boom")
		require.Equal(t, 3, seen.get(poison.IDs[0]), "delivered exactly MaxAttempts times")
	})

	t.Run("AHandlerPanicIsRetriedInPlaceAndTheReaderLives", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 30)
		var seen attempts
		rec := newRecorder()
		handler := actor.PropsFromFunc(func(ctx actor.Context) {
			if d, ok := ctx.Message().(*Delivery); ok {
				if seen.add(d.Event.ID) == 1 && d.Event.Stream == "acct-1" && d.Event.Version == 2 {
					panic("handler bug")
				}
				rec.end("w", d.Event)
				ctx.Respond(Ack{})
			}
		})
		var mu sync.Mutex
		var decisions []supervision.Decision
		o := groupOpts("panic", 1, nil, "w")
		o.Handler, o.Retry = handler, fastRetry(3)
		w := &testWorker{name: "w", sys: quietSystem(), pool: pgtest.NewPool(t, 8)}
		s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
		require.NoError(t, err)
		w.rt, err = startedRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), Supervision: supervision.ObserverFunc(func(d supervision.Decision) {
			mu.Lock()
			decisions = append(decisions, d)
			mu.Unlock()
		})})
		require.NoError(t, err)
		w.group, err = w.rt.StartGroup(ctx, o)
		require.NoError(t, err)
		t.Cleanup(func() { w.stop(t) })
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 30 }, "all handled (got %d)", observed(rec.distinct))
		require.Zero(t, rec.duplicates(), "acked once each")
		dls, err := store.DeadLetters(ctx, "panic", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Empty(t, dls)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, decisions, 1, "one supervision decision: the handler's restart")
		require.NotEqual(t, w.group.coordinator.String(), decisions[0].Supervisor, "the reader was not the one that failed")
		require.Equal(t, actor.RestartDirective, decisions[0].Directive)
	})

	t.Run("NoReplyWithinTheTimeoutCountsAsARetry", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 1, 3)
		var seen attempts
		rec := newRecorder()
		handler := actor.PropsFromFunc(func(ctx actor.Context) {
			if d, ok := ctx.Message().(*Delivery); ok {
				if seen.add(d.Event.ID) == 1 && d.Event.Version == 1 {
					return // never answers
				}
				rec.end("w", d.Event)
				ctx.Respond(Ack{})
			}
		})
		o := groupOpts("timeout", 1, nil, "w")
		o.Handler, o.Retry, o.HandlerTimeout = handler, fastRetry(3), 200*time.Millisecond
		startWorker(t, schema, "w", o)
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 3 }, "all handled")
		evs, err := store.ReadStream(ctx, "acct-0", 1, 1)
		require.NoError(t, err)
		require.Equal(t, 2, seen.get(evs[0].ID))
		require.Empty(t, rec.order, "the timed-out event was redelivered before the next one")
	})

	t.Run("TheTransactionalHandlerAppliesEachEventOnceAcrossATakeover", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		q := pgx.Identifier{schema}.Sanitize()
		_, err := store.Pool().Exec(ctx, `CREATE TABLE `+q+`.proj (event_id uuid PRIMARY KEY, applied int NOT NULL)`)
		require.NoError(t, err)
		seed(t, store, "acct", 20, 600)
		var handled atomic.Int64
		projector := func() *actor.Props {
			return actor.PropsFromFunc(func(ctx actor.Context) {
				d, ok := ctx.Message().(*Delivery)
				if !ok {
					return
				}
				err := CommitWithCheckpoint(d.Context, store, d, func(c context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(c, `INSERT INTO `+q+`.proj AS p (event_id, applied) VALUES ($1, 1)
						ON CONFLICT (event_id) DO UPDATE SET applied = p.applied + 1`, d.Event.ID)
					return err
				})
				if err == nil {
					handled.Add(1)
				}
				ctx.Respond(answer(err))
			})
		}
		oa, ob := groupOpts("exactly", 4, nil, "a"), groupOpts("exactly", 4, nil, "b")
		oa.Handler, ob.Handler = projector(), projector()
		a := startWorker(t, schema, "a", oa)
		b := startWorker(t, schema, "b", ob)
		pgtest.Eventually(t, waitLong, func() bool { return handled.Load() > 150 }, "both drain")
		a.kill(t)
		pgtest.Eventually(t, waitLong, func() bool { return len(b.owned()) == 4 }, "b takes over")
		var n, over int
		pgtest.Eventually(t, waitLong, func() bool {
			_ = store.Pool().QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE applied <> 1) FROM `+q+`.proj`).Scan(&n, &over)
			return n == 600
		}, "all 600 projected (got %d)", n)
		require.Zero(t, over, "every event applied exactly once")
	})
}

// spans collects finished spans in memory.
func spanRecorder(t *testing.T) (*observability.Telemetry, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return observability.New(observability.Options{TracerProvider: tp, Logger: testLoggerOrDiscard()}), exp
}

func TestZombie(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 10, 60)
	gate := make(chan struct{})
	blocked := make(chan uuid.UUID, 1)
	var once sync.Once
	recA, recB := newRecorder(), newRecorder()
	zombie := actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			recA.end("a", d.Event)
			once.Do(func() {
				blocked <- d.Event.ID
				<-gate // paused past its ttl
			})
			ctx.Respond(Ack{})
		}
	})
	tel, spans := spanRecorder(t)
	oa := groupOpts("zombie", 1, nil, "a")
	oa.Handler, oa.CheckpointEvery = zombie, 1
	a := &testWorker{name: "a", sys: quietSystem(), pool: pgtest.NewPool(t, 8)}
	sa, err := eventsource.New(a.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	a.rt, err = startedRuntime(ctx, a.sys, sa, RuntimeOptions{Logger: testLogger(), Telemetry: tel})
	require.NoError(t, err)
	oa.Worker = "a"
	a.group, err = a.rt.StartGroup(ctx, oa)
	require.NoError(t, err)
	t.Cleanup(func() { a.stop(t) })
	first := <-blocked

	// Freeze a's lease: hold its worker row so its passes hang.
	q := pgx.Identifier{schema}.Sanitize()
	tx, err := store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+q+`.lease_workers WHERE subscription = 'zombie' AND worker = 'a' FOR UPDATE`)
	require.NoError(t, err)

	// Watch the checkpoint: it must never move backwards.
	var regressions atomic.Int64
	watch, stopWatch := context.WithCancel(ctx)
	var watched sync.WaitGroup
	watched.Add(1)
	go func() {
		defer watched.Done()
		var last int64
		for watch.Err() == nil {
			if p, err := store.Checkpoint(watch, "zombie", 0); err == nil {
				if p < last {
					regressions.Add(1)
				}
				last = max(last, p)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()

	ob := groupOpts("zombie", 1, recB, "b")
	b := startWorker(t, schema, "b", ob)
	pgtest.Eventually(t, waitLong, func() bool { return len(b.owned()) == 1 }, "b takes the expired bucket")
	pgtest.Eventually(t, waitLong, func() bool { return recB.distinct() == 60 }, "b handles everything (got %d)", observed(recB.distinct))

	close(gate) // the zombie wakes up and acks
	pgtest.Eventually(t, waitLong, func() bool {
		for _, s := range spans.GetSpans() {
			if s.Name == obsname.SpanLeaseFenceLost {
				return true
			}
		}
		return false
	}, "the zombie stops on its lost fence")
	require.NoError(t, tx.Rollback(ctx))
	stopWatch()
	watched.Wait()

	require.Equal(t, 1, recA.distinct(), "the zombie handled nothing after waking")
	require.Equal(t, 1, recB.count[first], "the event in flight was redelivered by the new owner")
	require.Zero(t, regressions.Load(), "the checkpoint never moved backwards")
	head, err := store.HeadPosition(ctx)
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool {
		p, _ := store.Checkpoint(ctx, "zombie", 0)
		return p == head
	}, "the new owner's checkpoint reaches the head")
	_ = fmt.Sprint
}

// With several events of a bucket in flight, events of one stream still go
// one at a time and in order, retries included; the checkpoint never passes
// an unfinished event.
func TestSeveralInFlightKeepPerStreamOrderThroughRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 12, 600)
	var seen attempts
	rec := newRecorder()
	handler := actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			if seen.add(d.Event.ID) == 1 && d.Event.Position%7 == 0 {
				ctx.Respond(Retry{Reason: "once more"})
				return
			}
			rec.begin("w", d.Event)
			rec.end("w", d.Event)
			if d.Event.Position%50 == 0 {
				// CommitWithCheckpoint refuses: it needs MaxInFlight 1.
				err := CommitWithCheckpoint(d.Context, store, d, func(context.Context, pgx.Tx) error { return nil })
				var oe *kumierr.ConfigError
				if !errors.As(err, &oe) || oe.Field != "actors.GroupOptions.MaxInFlight" {
					panic(fmt.Sprintf("CommitWithCheckpoint with MaxInFlight 16: %v", err))
				}
			}
			ctx.Respond(Ack{})
		}
	})
	o := groupOpts("window", 2, nil, "w")
	o.Handler, o.Retry, o.MaxInFlight = handler, fastRetry(3), 16
	w := startWorker(t, schema, "w", o)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 600 }, "all handled (got %d)%s",
		observed(rec.distinct), observed(w.diagnose))
	require.Empty(t, rec.order, "per-stream order")
	require.Zero(t, rec.duplicates())
	w.stop(t)
	head, err := store.HeadPosition(ctx)
	require.NoError(t, err)
	cps, err := store.Checkpoints(ctx, "window")
	require.NoError(t, err)
	for _, c := range cps {
		require.LessOrEqual(t, c.Position, head)
	}
	dls, err := store.DeadLetters(ctx, "window", eventsource.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, dls)
}

// TestAHandlerPanickingOnEveryEventRestartsWithTheFirstBackoff: a handler
// that panics on the first attempt of every event and handles its retry
// succeeds between panics, so each restart is a first one: the shortest
// backoff, and the restart budget never runs out. (Before, the handler's
// supervisor counted the panics of every event together: its restarts
// waited up to ~10 s, and it was stopped after 10 within a minute.)
func TestAHandlerPanickingOnEveryEventRestartsWithTheFirstBackoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 4, 14)
	rec := newRecorder()
	handler := actor.PropsFromFunc(func(c actor.Context) {
		if d, ok := c.Message().(*Delivery); ok {
			if d.Attempt == 0 {
				panic("fails every first attempt")
			}
			rec.end("w", d.Event)
			c.Respond(Ack{})
		}
	})
	var mu sync.Mutex
	var restarts []supervision.Decision
	o := groupOpts("panicevery", 1, nil, "w")
	o.Handler, o.Retry = handler, fastRetry(3)
	w := &testWorker{name: "w", sys: quietSystem(), pool: pgtest.NewPool(t, 8)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), Supervision: supervision.ObserverFunc(func(d supervision.Decision) {
		if d.Strategy == "one_for_one" && d.Directive != actor.ResumeDirective && strings.Contains(d.Child, "kumi-handler-") {
			mu.Lock()
			restarts = append(restarts, d)
			mu.Unlock()
		}
	})})
	require.NoError(t, err)
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 14 }, "all handled (got %d)", observed(rec.distinct))

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, restarts, 14, "one restart per event")
	first := supervision.Backoff{}.Ceiling(1)
	for i, d := range restarts {
		require.Equal(t, actor.RestartDirective, d.Directive, "restart %d: %+v", i, d)
		require.Equal(t, 1, d.Attempt, "restart %d counts as a first: the handler succeeded since the last", i)
		require.Less(t, d.Delay, first+1, "restart %d waits at most the first backoff", i)
	}
}
