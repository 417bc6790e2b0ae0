package actors

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/supervision"
)

// logRecorder keeps the records of one level and above.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// find returns the attributes of the first record with message msg.
func (l *logRecorder) find(msg string) (map[string]slog.Value, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if r.Message == msg {
			attrs := map[string]slog.Value{}
			r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
			return attrs, true
		}
	}
	return nil, false
}

// appendTyped appends one event of type typ to stream.
func appendTyped(t *testing.T, store *eventsource.Store, stream, typ string) eventsource.AppendResult {
	t.Helper()
	res, err := store.Append(context.Background(), stream, eventsource.Any, []eventsource.EventData{{Type: typ, Data: []byte(`{}`)}})
	require.NoError(t, err)
	return res
}

// deadLetterIDs returns the ids of the subscription's dead letters.
func deadLetterIDs(t *testing.T, store *eventsource.Store, sub string) map[string]int {
	t.Helper()
	dls, err := store.DeadLetters(context.Background(), sub, eventsource.DeadLetterFilter{})
	require.NoError(t, err)
	out := map[string]int{}
	for _, d := range dls {
		out[d.EventID.String()] = d.Attempts
	}
	return out
}

// One bad handler must not take its bucket down: a poison event costs its
// own retries and dead letter; a handler that is stopped, exhausted or hung
// is replaced, and the healthy events behind it are delivered.
func TestHandlerFailuresAreContained(t *testing.T) {
	t.Parallel()

	// 3 poison events × 5 attempts = 15 panics: more than the handler
	// supervisor's budget of 10 a minute, which then stops the handler.
	t.Run("PoisonEventsExhaustingTheHandlersRestartBudgetCostOnlyTheirOwnDeadLetters", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		var poison []string
		for i := 0; i < 3; i++ {
			poison = append(poison, appendTyped(t, store, "acct-p", "Poison").IDs[0].String())
		}
		seed(t, store, "acct", 3, 3)
		rec := newRecorder()
		handler := actor.PropsFromFunc(func(ctx actor.Context) {
			if d, ok := ctx.Message().(*Delivery); ok {
				if d.Event.Type == "Poison" {
					panic("poison")
				}
				rec.end("w", d.Event)
				ctx.Respond(Ack{})
			}
		})
		o := groupOpts("poisons", 1, nil, "w")
		o.Handler, o.Retry, o.HandlerTimeout = handler, fastRetry(5), time.Second
		startWorker(t, schema, "w", o)
		pgtest.Eventually(t, 30*time.Second, func() bool { return rec.distinct() == 3 }, "the healthy events handled")
		dls := deadLetterIDs(t, store, "poisons")
		require.Len(t, dls, 3, "the poison events, and only they, are dead-lettered: %v", dls)
		for _, id := range poison {
			require.Equal(t, 5, dls[id], "poison %s: its own 5 attempts", id)
		}
	})

	// A handler that blocks for ever (ignoring its context) is replaced at
	// HandlerTimeout; each attempt reaches a handler (none waits behind
	// the hung call in its mailbox), and the healthy events are delivered.
	t.Run("AHungHandlerIsReplacedAndTheEventsBehindItAreDelivered", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		hang := appendTyped(t, store, "acct-h", "Hang").IDs[0]
		seed(t, store, "acct", 5, 5)
		rec := newRecorder()
		var (
			hangMu   sync.Mutex
			hangSeen = map[int]int{} // Delivery.Attempt → how many times
		)
		gate := make(chan struct{})
		handler := actor.PropsFromFunc(func(ctx actor.Context) {
			if d, ok := ctx.Message().(*Delivery); ok {
				if d.Event.Type == "Hang" {
					hangMu.Lock()
					hangSeen[d.Attempt]++
					hangMu.Unlock()
					<-gate // blocks, whatever its context says
					return
				}
				rec.end("w", d.Event)
				ctx.Respond(Ack{})
			}
		})
		logs := &logRecorder{}
		o := groupOpts("hung", 1, nil, "w")
		o.Handler, o.Retry, o.HandlerTimeout, o.Logger = handler, fastRetry(3), time.Second, slog.New(logs)
		startWorker(t, schema, "w", o)
		t.Cleanup(func() { close(gate) }) // before the worker stops (cleanups run last first)
		pgtest.Eventually(t, 30*time.Second, func() bool { return rec.distinct() == 5 }, "the healthy events handled")
		// Each of the 3 attempts reached a handler, and none beyond the
		// budget. (A reader that lost its lease on a loaded machine starts
		// the event's attempts again: a repeat, never a fourth attempt.)
		hangMu.Lock()
		seen := maps.Clone(hangSeen)
		hangMu.Unlock()
		require.Equal(t, []int{0, 1, 2}, slices.Sorted(maps.Keys(seen)), "attempts that reached a handler (attempt → times): %v", seen)
		dls := deadLetterIDs(t, store, "hung")
		require.Equal(t, map[string]int{hang.String(): 3}, dls, "only the hanging event is dead-lettered")
		attrs, ok := logs.find(msgHandlerHung)
		require.True(t, ok, "a hung handler is logged at Warn")
		require.Equal(t, int64(0), attrs["bucket"].Int64())
		require.Equal(t, hang.String(), attrs["event_id"].String())
		require.GreaterOrEqual(t, attrs["unanswered_for"].Duration(), time.Second)
	})

	// A handler whose goroutine is free but that lets one delivery go
	// unanswered (here: it answers from goroutines of its own, and drops
	// one event's first attempt) is alive: it answers the probe, keeps its
	// place and gets the retry; the other events in flight are not sent
	// again.
	t.Run("AHandlerThatIsAliveButLateIsKeptAndOnlyTheLateEventRetried", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 4, 20)
		late, err := store.ReadStream(context.Background(), "acct-2", 1, 1)
		require.NoError(t, err)
		rec := newRecorder()
		var seen attempts
		var instances atomic.Int32
		root := quietSystem().Root
		handler := actor.PropsFromProducer(func() actor.Actor {
			instances.Add(1)
			return actor.ReceiveFunc(func(ctx actor.Context) {
				if d, ok := ctx.Message().(*Delivery); ok {
					if seen.add(d.Event.ID) == 1 && d.Event.ID == late[0].ID {
						return // dropped: never answered
					}
					go func() { // answered from elsewhere, as async handlers do
						rec.end("w", d.Event)
						d.Respond(root, Ack{})
					}()
				}
			})
		})
		o := groupOpts("alive", 1, nil, "w")
		o.Handler, o.Retry, o.HandlerTimeout, o.MaxInFlight = handler, fastRetry(3), time.Second, 4
		startWorker(t, schema, "w", o)
		pgtest.Eventually(t, 30*time.Second, func() bool { return rec.distinct() == 20 }, "every event handled")
		require.Equal(t, 2, seen.get(late[0].ID), "the late event is retried once")
		require.Zero(t, rec.duplicates(), "no other event is delivered again")
		require.EqualValues(t, 1, instances.Load(), "the live handler is kept")
		require.Empty(t, deadLetterIDs(t, store, "alive"))
	})

	// A handler that stops itself is replaced: the events after it are
	// delivered to its successor.
	t.Run("AStoppedHandlerIsReplaced", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		appendTyped(t, store, "acct-s", "Stop")
		seed(t, store, "acct", 3, 6)
		rec := newRecorder()
		var instances atomic.Int32
		handler := actor.PropsFromProducer(func() actor.Actor {
			instances.Add(1)
			return actor.ReceiveFunc(func(ctx actor.Context) {
				if d, ok := ctx.Message().(*Delivery); ok {
					rec.end("w", d.Event)
					ctx.Respond(Ack{})
					if d.Event.Type == "Stop" {
						ctx.Stop(ctx.Self())
					}
				}
			})
		})
		o := groupOpts("stopped", 1, nil, "w")
		o.Handler, o.HandlerTimeout = handler, 2*time.Second
		// A replacement waits a second: long enough to see it in the status.
		o.Retry = RetryPolicy{MaxAttempts: 3, Backoff: supervision.Backoff{Initial: time.Second, Max: time.Second, Jitter: supervision.NoJitter}}
		w := startWorker(t, schema, "w", o)
		pgtest.Eventually(t, 30*time.Second, func() bool {
			st := w.group.g.statusSnapshot()
			return len(st.Owned) == 1 && st.Owned[0].State == readerReplacingHandler
		}, "the status shows the handler being replaced")
		pgtest.Eventually(t, 30*time.Second, func() bool { return rec.distinct() == 7 }, "every event handled")
		require.Empty(t, deadLetterIDs(t, store, "stopped"))
		require.GreaterOrEqual(t, instances.Load(), int32(2), "the stopped handler was replaced")
	})
}
