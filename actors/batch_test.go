package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// batchLog records the batches a handler received.
type batchLog struct {
	mu      sync.Mutex
	batches []seenBatch
}

type seenBatch struct {
	first   int64 // Events[0].Position
	n       int
	bytes   int
	attempt int
}

func (l *batchLog) add(b *Batch) {
	size := 0
	for _, e := range b.Events {
		size += eventSize(e)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, seenBatch{first: b.Events[0].Position, n: len(b.Events), bytes: size, attempt: b.Attempt})
}

func (l *batchLog) all() []seenBatch {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]seenBatch(nil), l.batches...)
}

// positionOf sequences the store's events and returns the position of
// stream's event at version.
func positionOf(t *testing.T, store *eventsource.Store, stream string, version int64) int64 {
	t.Helper()
	_, err := store.Sequence(context.Background())
	require.NoError(t, err)
	evs, err := store.ReadStream(context.Background(), stream, version, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	return evs[0].Position
}

// lastPosition is the position of the category's last event, once every
// event appended to it is sequenced (the runtime's sequencer may not have
// got to them yet).
func lastPosition(t *testing.T, store *eventsource.Store, category string) int64 {
	t.Helper()
	ctx := context.Background()
	var unsequenced int
	pgtest.Eventually(t, waitLong, func() bool {
		_, err := store.Sequence(ctx)
		require.NoError(t, err)
		require.NoError(t, store.Pool().QueryRow(ctx, "SELECT count(*) FROM "+store.QuotedSchema()+
			".appends WHERE category = $1 AND last_position IS NULL", category).Scan(&unsequenced))
		return unsequenced == 0
	}, "every event of %s is sequenced (%d appends are not)", category, observed(func() int { return unsequenced }))
	evs, err := store.ReadBucket(ctx, category, 0, 1, 0, 10000)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	return evs[len(evs)-1].Position
}

func batchOpts(sub string, buckets int, handler *actor.Props, maxEvents int) GroupOptions {
	o := groupOpts(sub, buckets, nil, "")
	o.Handler, o.Retry, o.Batch = handler, fastRetry(3), BatchOptions{MaxEvents: maxEvents}
	return o
}

// batchFailingAt is a batch handler that fails with err every batch that
// holds the event at target, and records the events of every other batch.
func batchFailingAt(rec *recorder, target int64, err error) *actor.Props {
	return BatchFunc(func(_ context.Context, b *Batch) error {
		for _, e := range b.Events {
			if e.Position == target {
				return err
			}
		}
		for _, e := range b.Events {
			rec.begin("w", e)
			rec.end("w", e)
		}
		return nil
	})
}

func TestBatchedDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// The handler stops at one event of a batch: the events before it are
	// acked and never delivered again; the retry starts at it (attempt 1)
	// and goes on in order.
	t.Run("ABatchDoneUpToAnEventIsRetriedFromThatEventInOrder", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 30)
		target := positionOf(t, store, "acct-1", 1) // the 5th event
		rec, log := newRecorder(), &batchLog{}
		var failed atomic.Bool
		handler := BatchFunc(func(_ context.Context, b *Batch) error {
			log.add(b)
			for i, e := range b.Events {
				if e.Position == target && failed.CompareAndSwap(false, true) {
					return DoneUpTo(i, errors.New("boom"))
				}
				rec.begin("w", e)
				rec.end("w", e)
			}
			return nil
		})
		startWorker(t, schema, "w", batchOpts("partial", 1, handler, 8))
		last := lastPosition(t, store, "acct")
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "partial", 0)
			return err == nil && cp == last
		}, "the checkpoint reaches the last event")
		require.Equal(t, 30, rec.distinct())
		require.Zero(t, rec.duplicates(), "the events done before the failure are not delivered again")
		require.Empty(t, rec.order)
		var retried bool
		for _, b := range log.all() {
			require.LessOrEqual(t, b.n, 8, "MaxEvents bounds a batch")
			retried = retried || (b.first == target && b.attempt == 1)
		}
		require.True(t, retried, "the retry starts at the event that failed, as its attempt 1: %v", log.all())
		dls, err := store.DeadLetters(ctx, "partial", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Empty(t, dls)
	})

	// One event of a batch is dead-lettered at once; the others, before
	// and after it, are handled once, in order.
	t.Run("AnEventOfABatchIsDeadLetteredAndTheRestHandled", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 30)
		target := positionOf(t, store, "acct-2", 2)
		rec := newRecorder()
		handler := BatchFunc(func(_ context.Context, b *Batch) error {
			for i, e := range b.Events {
				if e.Position == target {
					return DoneUpTo(i, Permanent(errors.New("cannot apply")))
				}
				rec.begin("w", e)
				rec.end("w", e)
			}
			return nil
		})
		startWorker(t, schema, "w", batchOpts("dlbatch", 1, handler, 10))
		last := lastPosition(t, store, "acct")
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "dlbatch", 0)
			return err == nil && cp == last
		}, "the checkpoint reaches the last event")
		require.Equal(t, 29, rec.distinct())
		require.Zero(t, rec.duplicates())
		require.Empty(t, rec.order)
		dls, err := store.DeadLetters(ctx, "dlbatch", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.Equal(t, target, dls[0].Position)
		require.Equal(t, "cannot apply", dls[0].Reason)
		require.Equal(t, 1, dls[0].Attempts, "dead-lettered at once")
	})

	// A batch that fails as a whole (a bare retryable error, a panic, a
	// timeout) does not say which event broke it: the attempt is charged
	// to no event, and the batch is narrowed to its first one, whose own
	// failures are charged. So with a budget of one attempt only the
	// event at fault is dead-lettered. The failure was charged to the
	// batch's first event, which, with MaxAttempts 1, was dead-lettered
	// without ever failing alone — every event before the poison one was
	// (found by internal/window's model of the actor).
	t.Run("ABatchFailedAsAWholeIsChargedToNoEventOfIt", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 30)
		target := positionOf(t, store, "acct-0", 1) // the 4th event
		rec := newRecorder()
		handler := batchFailingAt(rec, target, errors.New("boom"))
		opts := batchOpts("wholefail", 1, handler, 10)
		opts.Retry.MaxAttempts = 1
		startWorker(t, schema, "w", opts)
		last := lastPosition(t, store, "acct")
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "wholefail", 0)
			return err == nil && cp == last
		}, "the checkpoint reaches the last event")
		dls, err := store.DeadLetters(ctx, "wholefail", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, dls, 1, "only the event at fault is dead-lettered: %+v", dls)
		require.Equal(t, target, dls[0].Position)
		require.Equal(t, 29, rec.distinct())
		require.Zero(t, rec.duplicates())
	})

	// A bare Permanent error does not say which event of the batch it is
	// about: the batch is narrowed to its first event until the error
	// comes from a batch of one, whose event is then dead-lettered. Only
	// the event at fault is.
	t.Run("ABarePermanentErrorDeadLettersOnlyTheEventAtFault", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 30)
		target := positionOf(t, store, "acct-0", 1) // the 4th event
		rec := newRecorder()
		handler := batchFailingAt(rec, target, Permanent(errors.New("cannot apply")))
		startWorker(t, schema, "w", batchOpts("barepermanent", 1, handler, 10))
		last := lastPosition(t, store, "acct")
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "barepermanent", 0)
			return err == nil && cp == last
		}, "the checkpoint reaches the last event")
		require.Equal(t, 29, rec.distinct())
		require.Zero(t, rec.duplicates())
		require.Empty(t, rec.order)
		dls, err := store.DeadLetters(ctx, "barepermanent", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.Equal(t, target, dls[0].Position)
		require.Equal(t, "cannot apply", dls[0].Reason)
	})

	// An actor handler panics on every batch that holds one event. The
	// batch is retried with its first event alone, so the events before
	// the bad one are handled, once; the bad one, then first, is retried
	// alone until its budget is spent and dead-lettered as panicking.
	t.Run("APanicInABatchHandlerChargesOnlyTheEventThatPanics", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 30)
		target := positionOf(t, store, "acct-0", 2) // the 7th event
		rec := newRecorder()
		handler := actor.PropsFromFunc(func(ctx actor.Context) {
			b, ok := ctx.Message().(*Batch)
			if !ok {
				return
			}
			for _, e := range b.Events {
				if e.Position == target {
					panic(fmt.Sprintf("cannot handle %d", e.Position))
				}
			}
			for _, e := range b.Events {
				rec.begin("w", e)
				rec.end("w", e)
			}
			ctx.Respond(BatchAck{Done: len(b.Events)})
		})
		startWorker(t, schema, "w", batchOpts("panicbatch", 1, handler, 10))
		last := lastPosition(t, store, "acct")
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "panicbatch", 0)
			return err == nil && cp == last
		}, "the checkpoint reaches the last event")
		require.Equal(t, 29, rec.distinct())
		require.Zero(t, rec.duplicates())
		require.Empty(t, rec.order)
		dls, err := store.DeadLetters(ctx, "panicbatch", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, dls, 1, "only the event that panics is dead-lettered")
		require.Equal(t, target, dls[0].Position)
		require.Contains(t, dls[0].Reason, "handler panicked: cannot handle")
		// Four deliveries: the batch it broke first (charged to no event),
		// then three alone, the budget.
		require.Equal(t, 4, dls[0].Attempts)
	})

	// A batch handler stuck in a call is probed and replaced as a
	// one-event handler is; the batch goes to its successor.
	t.Run("AHungBatchHandlerIsReplacedAndItsBatchRetried", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 30)
		rec := newRecorder()
		release := make(chan struct{})
		var calls atomic.Int32
		handler := BatchFunc(func(_ context.Context, b *Batch) error {
			if calls.Add(1) == 1 {
				<-release // stuck, ignoring its context
				return nil
			}
			for _, e := range b.Events {
				rec.begin("w", e)
				rec.end("w", e)
			}
			return nil
		})
		o := batchOpts("hungbatch", 1, handler, 10)
		o.HandlerTimeout = 300 * time.Millisecond
		startWorker(t, schema, "w", o)
		t.Cleanup(func() { close(release) })
		last := lastPosition(t, store, "acct")
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "hungbatch", 0)
			return err == nil && cp == last
		}, "the checkpoint reaches the last event")
		require.Equal(t, 30, rec.distinct())
		require.Zero(t, rec.duplicates())
		require.Empty(t, rec.order)
		// The stuck handler takes nothing more: only its successor can
		// have handled the events.
		dls, err := store.DeadLetters(ctx, "hungbatch", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Empty(t, dls)
	})

	// MaxBytes bounds a batch's data (an event of 8 or 9 bytes here: at
	// most two in 20 bytes), and a Func handler takes batches too.
	t.Run("MaxBytesBoundsABatch", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 3, 30)
		rec, log := newRecorder(), &batchLog{}
		handler := BatchFunc(func(_ context.Context, b *Batch) error {
			log.add(b)
			for _, e := range b.Events {
				rec.begin("w", e)
				rec.end("w", e)
			}
			return nil
		})
		o := batchOpts("bytes", 1, handler, 10)
		o.Batch.MaxBytes = 20
		startWorker(t, schema, "w", o)
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 30 }, "all handled")
		most := 0
		for _, b := range log.all() {
			require.LessOrEqual(t, b.bytes, 20, "MaxBytes bounds a batch: %v", b)
			most = max(most, b.n)
		}
		require.Equal(t, 2, most)
		require.Zero(t, rec.duplicates())
	})

	// Three workers, eight buckets, workers joining while batches are
	// delivered: every stream in order, never on two workers at once.
	t.Run("PerStreamOrderHoldsWithSeveralWorkers", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 20, 600)
		rec := newRecorder()
		worker := func(name string) GroupOptions {
			return batchOpts("orderbatch", 8, BatchFunc(func(_ context.Context, b *Batch) error {
				for _, e := range b.Events {
					rec.begin(name, e)
					rec.end(name, e)
				}
				return nil
			}), 16)
		}
		a := startWorker(t, schema, "a", worker("a"))
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() > 50 }, "a started")
		b := startWorker(t, schema, "b", worker("b"))
		c := startWorker(t, schema, "c", worker("c"))
		pgtest.Eventually(t, waitLong, func() bool { return fairSplit(8, a, b, c) }, "fair split: %v", owners(a, b, c))
		seed(t, store, "acct", 20, 300)
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 900 }, "all handled (got %d)", observed(rec.distinct))
		require.Empty(t, rec.order, "per-stream order")
		require.Empty(t, rec.overlaps, "no stream on two workers at once")
		require.Zero(t, rec.duplicates(), "cooperative handoffs deliver nothing twice")
	})
}

func TestBatchExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// A worker is killed (Group.Abort) while its handler is inside a
	// batch's transaction, its writes made; the transaction then goes on.
	// The next owner starts from whatever committed: every effect once.
	t.Run("ABatchCommitsItsEffectsOnceAcrossATakeover", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		proj := newProjection(t, store, schema)
		seed(t, store, "acct", 3, 60)
		blockAt := positionOf(t, store, "acct-0", 8) // the 25th event
		blocked, release := make(chan struct{}), make(chan struct{})
		aEnded := make(chan error, 1) // how the killed worker's transaction ended
		var blockOnce sync.Once
		var done sync.WaitGroup
		t.Cleanup(done.Wait)
		apply := func(c context.Context, tx pgx.Tx, evs []eventsource.RecordedEvent) error {
			for _, e := range evs {
				if _, err := tx.Exec(c, `INSERT INTO `+proj.q+`.proj AS p (event_id, applied) VALUES ($1, 1)
					ON CONFLICT (event_id) DO UPDATE SET applied = p.applied + 1`, e.ID); err != nil {
					return err
				}
			}
			return nil
		}
		handler := func(worker string) *actor.Props {
			return BatchFunc(func(ctx context.Context, b *Batch) error {
				fn := apply
				if worker == "a" && b.Events[0].Position <= blockAt && blockAt <= b.Events[len(b.Events)-1].Position {
					// Worker a's batch goes on after a is killed: its own
					// context, not the delivery's.
					ctx = context.WithoutCancel(ctx)
					fn = func(c context.Context, tx pgx.Tx, evs []eventsource.RecordedEvent) error {
						if err := apply(c, tx, evs); err != nil {
							return err
						}
						blockOnce.Do(func() { done.Add(1); close(blocked); <-release; done.Done() })
						return nil
					}
				}
				err := CommitBatchWithCheckpoint(ctx, store, b, fn)
				if worker == "a" && b.Events[0].Position <= blockAt && blockAt <= b.Events[len(b.Events)-1].Position {
					select {
					case aEnded <- err:
					default:
					}
				}
				return err
			})
		}
		a := startWorker(t, schema, "a", batchOpts("eobatch", 1, handler("a"), 10))
		select {
		case <-blocked:
		case <-time.After(waitLong):
			t.Fatal("worker a never reached the batch it blocks in")
		}
		a.group.Abort()
		startWorker(t, schema, "b", batchOpts("eobatch", 1, handler("b"), 10))
		close(release)
		last := lastPosition(t, store, "acct")
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "eobatch", 0)
			return err == nil && cp == last
		}, "the checkpoint reaches the last event")
		n, over := proj.counts(t)
		require.Equal(t, 60, n)
		require.Zero(t, over, "every effect committed once")
		select {
		case err := <-aEnded: // it committed (nil) or found its fence lost: both are once
			t.Logf("the killed worker's batch transaction ended: %v", err)
		default:
		}
	})

	// CommitBatchWithCheckpoint gives fn only the events the checkpoint
	// does not cover, and commits a DoneUpTo's prefix with the checkpoint.
	t.Run("CommitBatchWithCheckpointSkipsWhatIsCommittedAndCommitsAPrefix", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		proj := newProjection(t, store, schema)
		seed(t, store, "acct", 2, 8)
		_, err := store.Sequence(ctx)
		require.NoError(t, err)
		evs, err := store.ReadBucket(ctx, "acct", 0, 1, 0, 100)
		require.NoError(t, err)
		require.Len(t, evs, 8)
		require.NotZero(t, evs[0].Position)
		_, err = store.SaveCheckpoint(ctx, "direct", 0, evs[2].Position, nil)
		require.NoError(t, err)
		noFence := eventsource.FenceFunc(func(context.Context, pgx.Tx) error { return nil })
		b := &Batch{Events: evs, Subscription: "direct", Bucket: 0, Fence: noFence}
		var given [][]int64
		fn := func(failAt int) func(context.Context, pgx.Tx, []eventsource.RecordedEvent) error {
			return func(c context.Context, tx pgx.Tx, evs []eventsource.RecordedEvent) error {
				var ps []int64
				for i, e := range evs {
					if i == failAt {
						given = append(given, ps)
						return DoneUpTo(i, Permanent(errors.New("bad event")))
					}
					ps = append(ps, e.Position)
					if _, err := tx.Exec(c, `INSERT INTO `+proj.q+`.proj AS p (event_id, applied) VALUES ($1, 1)
						ON CONFLICT (event_id) DO UPDATE SET applied = p.applied + 1`, e.ID); err != nil {
						return err
					}
				}
				given = append(given, ps)
				return nil
			}
		}
		err = CommitBatchWithCheckpoint(ctx, store, b, fn(2))
		var partial *PartialError
		require.ErrorAs(t, err, &partial)
		require.Equal(t, 5, partial.Done, "indexes b.Events: 3 skipped, 2 done")
		require.True(t, partial.Committed)
		var permanent *PermanentError
		require.ErrorAs(t, err, &permanent)
		require.Equal(t, [][]int64{
			{evs[3].Position, evs[4].Position}, // the first run, rolled back
			{evs[3].Position, evs[4].Position}, // the prefix, committed
		}, given)
		cp, err := store.Checkpoint(ctx, "direct", 0)
		require.NoError(t, err)
		require.Equal(t, evs[4].Position, cp)
		given = nil
		require.NoError(t, CommitBatchWithCheckpoint(ctx, store, b, fn(-1)))
		require.Equal(t, [][]int64{{evs[5].Position, evs[6].Position, evs[7].Position}}, given)
		require.ErrorIs(t, CommitBatchWithCheckpoint(ctx, store, b, fn(-1)), ErrAlreadyCommitted)
		n, over := proj.counts(t)
		require.Equal(t, 5, n)
		require.Zero(t, over)
		require.Equal(t, BatchAck{Done: 5, Committed: true, Next: DeadLetter{Reason: "bad event"}}, batchReplyFor(partial, 8))
	})
}

func TestBatchOptionsAreValidatedNamingTheField(t *testing.T) {
	t.Parallel()
	base := GroupOptions{Subscription: "s", Category: "c", Buckets: 4, Handler: ackHandler(newRecorder(), "w")}
	for _, c := range []struct {
		field  string
		mutate func(o *GroupOptions)
	}{
		{"Batch.MaxEvents", func(o *GroupOptions) { o.Batch.MaxEvents = 10001 }},
		{"Batch.MaxEvents", func(o *GroupOptions) { o.Batch.MaxEvents = -1 }},
		{"Batch.MaxBytes", func(o *GroupOptions) { o.Batch.MaxBytes = 1 << 20 }}, // without MaxEvents
		{"Batch.MaxBytes", func(o *GroupOptions) { o.Batch.MaxEvents, o.Batch.MaxBytes = 10, -1 }},
		{"MaxInFlight", func(o *GroupOptions) { o.Batch.MaxEvents, o.MaxInFlight = 10, 4 }},
	} {
		o := base
		c.mutate(&o)
		var oe *kumierr.ConfigError
		require.ErrorAs(t, o.WithDefaults().Validate(), &oe, c.field)
		require.Equal(t, "actors.GroupOptions."+c.field, oe.Field)
	}
	o := base
	o.Batch = BatchOptions{MaxEvents: 100, MaxBytes: 1 << 20}
	require.NoError(t, o.WithDefaults().Validate())
}

// batchReplyFor's mapping of a BatchHandlerFunc's errors.
func TestBatchReplyFor(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for name, c := range map[string]struct {
		err  error
		want any
	}{
		"nil":               {nil, BatchAck{Done: 4}},
		"error":             {boom, Retry{Reason: "boom"}},
		"permanent":         {Permanent(boom), Retry{Reason: "boom"}},
		"done up to":        {DoneUpTo(2, boom), BatchAck{Done: 2, Next: Retry{Reason: "boom"}}},
		"done up to, dl":    {fmt.Errorf("wrapped: %w", DoneUpTo(3, Permanent(boom))), BatchAck{Done: 3, Next: DeadLetter{Reason: "boom"}}},
		"done up to all":    {DoneUpTo(4, nil), BatchAck{Done: 4}},
		"done up to, nil":   {DoneUpTo(1, nil), BatchAck{Done: 1, Next: Retry{Reason: "kumi: done up to event 1 of 4"}}},
		"fence lost":        {fmt.Errorf("x: %w", eventsource.ErrFenceLost), BatchAck{Done: 4}},
		"already committed": {ErrAlreadyCommitted, BatchAck{Done: 4, Committed: true}},
		"out of range":      {DoneUpTo(5, boom), Retry{Reason: "kumi: DoneUpTo(5, …) outside a batch of 4 events: boom"}},
	} {
		require.Equal(t, c.want, batchReplyFor(c.err, 4), name)
	}
	require.Equal(t, BatchAck{Done: 0, Next: DeadLetter{Reason: "boom"}}, batchReplyFor(Permanent(boom), 1),
		"a batch of one: the error is its event's")
	require.Equal(t, BatchAck{Done: 0, Next: Retry{Reason: "boom"}}, batchReplyFor(boom, 1))
}
