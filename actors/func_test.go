package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/supervision"
)

// appendOne appends one event and returns its id.
func appendOne(t testing.TB, store *eventsource.Store, stream, typ, data string) uuid.UUID {
	t.Helper()
	res, err := store.Append(context.Background(), stream, eventsource.Any, []eventsource.EventData{{Type: typ, Data: []byte(data)}})
	require.NoError(t, err)
	return res.IDs[0]
}

// waitDeadLetter waits for the dead letter of event id.
func waitDeadLetter(t testing.TB, store *eventsource.Store, sub string, id uuid.UUID) eventsource.DeadLetter {
	t.Helper()
	var dl eventsource.DeadLetter
	pgtest.Eventually(t, waitLong, func() bool {
		var err error
		dl, err = store.DeadLetter(context.Background(), sub, id)
		return err == nil
	}, "event %s is dead-lettered", id)
	return dl
}

// deposit is the typed tests' event data.
type deposit struct {
	Amount int `json:"amount"`
}

func TestFunctionHandlers(t *testing.T) {
	t.Parallel()

	t.Run("AnErrorIsRetriedThePolicysNumberOfTimesThenDeadLettered", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 10)
		poison := appendOne(t, store, "acct-1", "Poison", `{}`)
		seed(t, store, "acct", 3, 10)
		var seen attempts
		acked := newRecorder()
		o := groupOpts("fn-retry", 1, nil, "w")
		o.Retry = fastRetry(3)
		o.Handler = Func(func(ctx context.Context, d *Delivery) error {
			seen.add(d.Event.ID)
			if d.Event.Type == "Poison" {
				return fmt.Errorf("attempt %d: boom", d.Attempt)
			}
			acked.end("w", d.Event)
			return nil
		})
		startWorker(t, schema, "w", o)
		dl := waitDeadLetter(t, store, "fn-retry", poison)
		require.Equal(t, 3, dl.Attempts)
		require.Equal(t, "retry budget of 3 attempts spent; last: attempt 2: boom", dl.Reason)
		require.Equal(t, 3, seen.get(poison), "delivered exactly MaxAttempts times")
		pgtest.Eventually(t, waitLong, func() bool { return acked.distinct() == 20 }, "every other event acked (got %d)", observed(acked.distinct))
		require.Zero(t, acked.duplicates())
	})

	t.Run("APermanentErrorDeadLettersAtOnceWithItsReason", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		poison := appendOne(t, store, "acct-1", "Poison", `{}`)
		seed(t, store, "acct", 3, 10)
		var seen attempts
		acked := newRecorder()
		o := groupOpts("fn-permanent", 1, nil, "w")
		o.Retry = fastRetry(5)
		o.Handler = Func(func(ctx context.Context, d *Delivery) error {
			seen.add(d.Event.ID)
			if d.Event.Type == "Poison" {
				return fmt.Errorf("apply: %w", Permanent(errors.New("account 1 is closed")))
			}
			acked.end("w", d.Event)
			return nil
		})
		startWorker(t, schema, "w", o)
		dl := waitDeadLetter(t, store, "fn-permanent", poison)
		require.Equal(t, 1, dl.Attempts)
		require.Equal(t, "account 1 is closed", dl.Reason)
		require.Equal(t, 1, seen.get(poison), "never retried")
		pgtest.Eventually(t, waitLong, func() bool { return acked.distinct() == 10 }, "the bucket moves on (got %d)", observed(acked.distinct))
	})

	t.Run("APanicIsARetryWhoseDeadLetterSaysItPanickedAndWhere", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		store, schema := newTestStore(t)
		poison := appendOne(t, store, "acct-1", "Poison", `{}`)
		seed(t, store, "acct", 3, 10)
		var seen attempts
		acked := newRecorder()
		var decisions atomic.Int64
		o := groupOpts("fn-panic", 1, nil, "w")
		o.Retry, o.Worker = fastRetry(3), "w"
		o.Handler = Func(func(ctx context.Context, d *Delivery) error {
			seen.add(d.Event.ID)
			if d.Event.Type == "Poison" {
				panic("kaboom")
			}
			acked.end("w", d.Event)
			return nil
		})
		w := &testWorker{name: "w", sys: quietSystem(), pool: pgtest.NewPool(t, 8)}
		s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
		require.NoError(t, err)
		w.rt, err = startedRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(),
			Supervision: supervision.ObserverFunc(func(supervision.Decision) { decisions.Add(1) })})
		require.NoError(t, err)
		w.group, err = w.rt.StartGroup(ctx, o)
		require.NoError(t, err)
		t.Cleanup(func() { w.stop(t) })
		dl := waitDeadLetter(t, store, "fn-panic", poison)
		require.Equal(t, 3, dl.Attempts)
		require.Contains(t, dl.Reason, "retry budget of 3 attempts spent; last: handler panicked: kaboom (in ")
		require.Contains(t, dl.Reason, "func_test.go:")
		require.Equal(t, 3, seen.get(poison))
		pgtest.Eventually(t, waitLong, func() bool { return acked.distinct() == 10 }, "the bucket moves on (got %d)", observed(acked.distinct))
		require.Zero(t, decisions.Load(), "a function handler's panic restarts nothing")
	})

	t.Run("ATypedHandlerDeadLettersWhatDoesNotDecodeAndNeverRetriesIt", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		appendOne(t, store, "acct-1", "Deposited", `{"amount":10}`)
		bad := appendOne(t, store, "acct-1", "Deposited", `{"amount":"ten"}`)
		appendOne(t, store, "acct-2", "Deposited", `{"amount":5}`)
		var seen attempts
		var total, calls atomic.Int64
		o := groupOpts("fn-typed", 1, nil, "w")
		o.Retry = fastRetry(5)
		decode := TypedFunc(func(ctx context.Context, d *Delivery, v deposit) error {
			total.Add(int64(v.Amount))
			calls.Add(1)
			return nil
		})
		o.Handler = Func(func(ctx context.Context, d *Delivery) error {
			seen.add(d.Event.ID)
			return decode(ctx, d)
		})
		startWorker(t, schema, "w", o)
		dl := waitDeadLetter(t, store, "fn-typed", bad)
		require.Equal(t, 1, dl.Attempts)
		require.Equal(t, 1, seen.get(bad), "never retried")
		require.Contains(t, dl.Reason, "kumi: decode Deposited event into actors.deposit: json: cannot unmarshal string")
		pgtest.Eventually(t, waitLong, func() bool { return calls.Load() == 2 }, "the others are handled")
		require.Equal(t, int64(15), total.Load())
	})

	t.Run("TheRouterDispatchesByTypeAndAcksTypesWithoutAFunction", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		store, schema := newTestStore(t)
		appendOne(t, store, "acct-1", "Opened", `{}`)
		appendOne(t, store, "acct-1", "Deposited", `{"amount":10}`)
		appendOne(t, store, "acct-1", "Withdrawn", `{"amount":3}`)
		appendOne(t, store, "acct-1", "Renamed", `{"name":"x"}`)
		last := appendOne(t, store, "acct-1", "Deposited", `{"amount":1}`)
		var mu sync.Mutex
		balance := 0
		var r Router
		On(&r, "Deposited", func(ctx context.Context, d *Delivery, v deposit) error {
			mu.Lock()
			defer mu.Unlock()
			balance += v.Amount
			return nil
		})
		On(&r, "Withdrawn", func(ctx context.Context, d *Delivery, v deposit) error {
			mu.Lock()
			defer mu.Unlock()
			balance -= v.Amount
			return nil
		})
		o := groupOpts("fn-router", 1, nil, "w")
		o.Handler, o.CheckpointEvery = r.Props(), 1
		startWorker(t, schema, "w", o)
		// The last event's position, once the sequencer has given it one
		// (until then ReadStream shows it with position 0).
		var pos int64
		pgtest.Eventually(t, waitLong, func() bool {
			evs, err := store.ReadStream(ctx, "acct-1", 4, 1)
			if err != nil || len(evs) != 1 {
				return false
			}
			require.Equal(t, last, evs[0].ID)
			pos = evs[0].Position
			return pos > 0
		}, "the last event is sequenced")
		pgtest.Eventually(t, waitLong, func() bool {
			p, _ := store.Checkpoint(ctx, "fn-router", 0)
			return p == pos
		}, "the checkpoint passes every event, those of types without a function included")
		mu.Lock()
		require.Equal(t, 8, balance)
		mu.Unlock()
		dls, err := store.DeadLetters(ctx, "fn-router", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Empty(t, dls)
	})

	t.Run("WithSeveralInFlightCallsOfOtherStreamsRunMeanwhile", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		appendOne(t, store, "acct-1", "Slow", `{}`)
		appendOne(t, store, "acct-2", "Fast", `{}`)
		fastDone := make(chan struct{})
		rec := newRecorder()
		o := groupOpts("fn-inflight", 1, nil, "w")
		o.MaxInFlight = 4
		o.Handler = Func(func(ctx context.Context, d *Delivery) error {
			if d.Event.Type == "Slow" {
				<-fastDone // handled one at a time, this would never return
			} else {
				close(fastDone)
			}
			rec.end("w", d.Event)
			return nil
		})
		startWorker(t, schema, "w", o)
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 2 }, "both handled")
	})

	t.Run("CommitWithCheckpointAppliesEachEventOnceAcrossATakeover", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		store, schema := newTestStore(t)
		q := pgx.Identifier{schema}.Sanitize()
		_, err := store.Pool().Exec(ctx, `CREATE TABLE `+q+`.proj (event_id uuid PRIMARY KEY, applied int NOT NULL)`)
		require.NoError(t, err)
		seed(t, store, "acct", 20, 600)
		var handled atomic.Int64
		project := Func(func(ctx context.Context, d *Delivery) error {
			return CommitWithCheckpoint(ctx, store, d, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+q+`.proj AS p (event_id, applied) VALUES ($1, 1)
					ON CONFLICT (event_id) DO UPDATE SET applied = p.applied + 1`, d.Event.ID)
				handled.Add(1)
				return err
			})
		})
		oa, ob := groupOpts("fn-exactly", 4, nil, "a"), groupOpts("fn-exactly", 4, nil, "b")
		oa.Handler, ob.Handler = project, project
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
		head, err := store.HeadPosition(ctx)
		require.NoError(t, err)
		pgtest.Eventually(t, waitLong, func() bool {
			cps, _ := store.Checkpoints(ctx, "fn-exactly")
			var done int
			for _, c := range cps {
				if m, _, err := store.BucketLag(ctx, "acct", c.Bucket, 4, c.Position); err == nil && m == 0 {
					done++
				}
			}
			return done == 4
		}, "every bucket's checkpoint covers its events (head %d)", head)
	})

	t.Run("TheContextIsTheDeliverys", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		appendOne(t, store, "acct-1", "Any", `{}`)
		same := make(chan bool, 1)
		o := groupOpts("fn-context", 1, nil, "w")
		o.Handler = Func(func(ctx context.Context, d *Delivery) error {
			same <- ctx == d.Context && ctx != nil
			return nil
		})
		startWorker(t, schema, "w", o)
		require.True(t, <-same)
	})
}

func TestReplyFor(t *testing.T) {
	t.Parallel()
	require.Equal(t, Ack{}, replyFor(nil))
	require.Equal(t, Ack{}, replyFor(fmt.Errorf("commit: %w", eventsource.ErrFenceLost)), "a lost fence: the new owner redoes it")
	require.Equal(t, Ack{Committed: true}, replyFor(fmt.Errorf("commit: %w", ErrAlreadyCommitted)), "an earlier attempt committed it")
	require.Equal(t, DeadLetter{Reason: "bad"}, replyFor(fmt.Errorf("x: %w", Permanent(errors.New("bad")))))
	require.Equal(t, Retry{Reason: "later"}, replyFor(errors.New("later")))
	require.NoError(t, Permanent(nil))
	var pe *PermanentError
	require.ErrorAs(t, Permanent(&DecodeError{EventType: "T", Into: "int", Err: errors.New("j")}), &pe)
	var de *DecodeError
	require.ErrorAs(t, pe, &de)
	require.Panics(t, func() {
		var r Router
		r.HandleFunc("A", func(context.Context, *Delivery) error { return nil })
		r.HandleFunc("A", func(context.Context, *Delivery) error { return nil })
	}, "a type registered twice")
}
