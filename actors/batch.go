package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
)

// BatchOptions turn on batched deliveries (see [Batch]). The zero value
// leaves them off: one event per delivery.
type BatchOptions struct {
	// MaxEvents bounds the events of one batch; 0 (the default) turns
	// batching off. At most 10,000.
	MaxEvents int
	// MaxBytes bounds the summed size of a batch's events' Data and
	// Metadata; 0 means no bound but MaxEvents. A batch always holds at
	// least one event, however large.
	MaxBytes int
}

// on reports whether batching is on.
func (o BatchOptions) on() bool { return o.MaxEvents > 0 }

// validate checks the batch options against the group's.
func (o BatchOptions) validate(maxInFlight int) error {
	switch {
	case o.MaxEvents < 0 || o.MaxEvents > 10000:
		return invalid("GroupOptions.Batch.MaxEvents", o.MaxEvents, "must be in [0, 10000] (0: no batching)")
	case o.MaxBytes < 0:
		return invalid("GroupOptions.Batch.MaxBytes", o.MaxBytes, "must be at least 0 (0: no byte bound)")
	case o.MaxBytes > 0 && !o.on():
		return invalid("GroupOptions.Batch.MaxBytes", o.MaxBytes, "needs Batch.MaxEvents above 0 (batching is off)")
	case o.on() && maxInFlight != 1:
		return invalid("GroupOptions.MaxInFlight", maxInFlight, "must be 1 with Batch.MaxEvents set: a bucket's batches are delivered one at a time")
	}
	return nil
}

// Batch is the message a handler receives, in place of a [*Delivery], when
// its group sets Batch.MaxEvents: a bucket's next events, in position
// order, at most Batch.MaxEvents of them and Batch.MaxBytes of data. A
// bucket has one batch with its handler at a time; events of one stream are
// in stream order within it and across batches. The handler answers once
// with a [BatchAck] (a [BatchFunc] returns an error instead): all done,
// done up to an event with the rest retried, or done up to an event that
// is dead-lettered and the rest delivered again in the next batch.
//
// A batch is retried as a Delivery is: its first event's attempts count
// against the group's RetryPolicy and, once spent, that event is
// dead-lettered. A panic, no answer within HandlerTimeout, or any answer
// other than a BatchAck retries the batch from its first event. Timeouts,
// probes and handler replacement act on the batch as on one delivery.
type Batch struct {
	// Events are the batch's events, in position order; never empty.
	Events []eventsource.RecordedEvent
	// Attempt counts deliveries of Events[0]: 0 the first time. The other
	// events may have been delivered before, behind a first event that
	// failed.
	Attempt int
	// Subscription, Generation, Bucket, Epoch and Fence are as in
	// [Delivery]; pass the batch to [CommitBatchWithCheckpoint] for
	// exactly-once.
	Subscription string
	Generation   int
	Bucket       int
	Epoch        int64
	Fence        eventsource.Fence
	// Context carries the delivery span of Events[0]; it is cancelled once
	// the reader is done with this attempt (as Delivery.Context).
	Context context.Context

	d *Delivery // the first event's delivery: the reply's address
}

// Respond answers the batch from outside its handling (see
// [Delivery.Respond]); while handling the Batch, ctx.Respond does the same.
func (b *Batch) Respond(ctx actor.SenderContext, reply any) { b.d.Respond(ctx, reply) }

// BatchAck answers a [*Batch].
type BatchAck struct {
	// Done counts the events handled, from the first: len(Events) acks
	// the whole batch.
	Done int
	// Committed says the handler committed the checkpoint through the
	// Done events with its own writes (see [CommitBatchWithCheckpoint]).
	Committed bool
	// Next answers event Done when Done < len(Events): a [Retry] (also
	// when nil) retries the batch from it, a [DeadLetter] dead-letters it;
	// the events after it are delivered again in the next batch.
	Next any
}

// BatchHandlerFunc handles a batch; [BatchFunc] turns it into the Handler
// of a group that sets Batch.MaxEvents. What it returns is the answer:
//
//   - nil acks every event of the batch;
//   - [DoneUpTo](i, err) (a [*PartialError]) acks the events before i and
//     answers event i as a [HandlerFunc]'s err would: an ordinary error
//     retries the batch from event i, an error wrapping [Permanent]
//     dead-letters event i, and the events after it come in the next batch;
//     DoneUpTo(len(b.Events), nil) is nil;
//   - an error wrapping [eventsource.ErrFenceLost] or [ErrAlreadyCommitted]
//     acks the whole batch (as for a HandlerFunc);
//   - any other error does not say which event failed: the batch is
//     retried with its first event alone (charged to no event: a batch
//     of one is charged to its event),
//     and for a batch of one event the error answers that event as a
//     HandlerFunc's would (Permanent dead-letters it).
//
// A panic, too, retries the batch with its first event alone, with a reason
// that says it panicked.
// Events before the failing one whose effects the handler did apply are
// applied again when it retries them, unless it says so with DoneUpTo or
// commits through [CommitBatchWithCheckpoint].
type BatchHandlerFunc func(ctx context.Context, b *Batch) error

// BatchFunc returns the props of a handler actor that calls fn for each
// batch and answers with what fn returns (see [BatchHandlerFunc]):
//
//	actors.GroupOptions{..., Handler: actors.BatchFunc(handle), Batch: actors.BatchOptions{MaxEvents: 100}}
//
// Without Batch.MaxEvents, fn receives each event as a batch of one.
func BatchFunc(fn BatchHandlerFunc) *actor.Props {
	if fn == nil {
		panic("kumi: actors.BatchFunc: nil BatchHandlerFunc")
	}
	return actor.PropsFromProducer(func() actor.Actor { return &batchFuncHandler{fn: fn} })
}

// batchFuncHandler is the actor behind [BatchFunc].
type batchFuncHandler struct {
	fn BatchHandlerFunc
}

// Receive answers each batch (or delivery, as a batch of one) with fn's
// outcome.
func (h *batchFuncHandler) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *Batch:
		m.Respond(c, h.answer(m))
	case *Delivery:
		b := singleBatch(m)
		answer := h.answer(b)
		if a, ok := answer.(BatchAck); ok {
			answer = a.one()
		}
		m.Respond(c, answer)
	}
}

// answer runs fn and turns its outcome, or its panic, into the reply.
func (h *batchFuncHandler) answer(b *Batch) (reply any) {
	defer func() {
		if r := recover(); r != nil {
			reply = &handlerPanicked{reason: panicReason(r)}
		}
	}()
	ctx := b.Context
	if ctx == nil {
		ctx = context.Background()
	}
	return batchReplyFor(h.fn(ctx, b), len(b.Events))
}

// singleBatch is a delivery as a batch of one event.
func singleBatch(d *Delivery) *Batch {
	return &Batch{Events: []eventsource.RecordedEvent{d.Event}, Attempt: d.Attempt, Subscription: d.Subscription,
		Generation: d.Generation, Bucket: d.Bucket, Epoch: d.Epoch, Fence: d.Fence, Context: d.Context, d: d}
}

// one is a batch-of-one's answer as a delivery's.
func (a BatchAck) one() any {
	if a.Done >= 1 {
		return Ack{Committed: a.Committed}
	}
	if a.Next == nil {
		return Retry{}
	}
	return a.Next
}

// batchReplyFor maps a BatchHandlerFunc's error to a BatchAck for a batch
// of n events.
func batchReplyFor(err error, n int) any {
	var partial *PartialError
	if !errors.As(err, &partial) {
		if a, ok := replyFor(err).(Ack); ok {
			return BatchAck{Done: n, Committed: a.Committed}
		}
		if n > 1 {
			// It does not say which event failed: the batch is retried
			// with its first event alone, which tells.
			return Retry{Reason: err.Error()}
		}
		partial = &PartialError{Done: 0, Err: err}
	}
	if partial.Done < 0 || partial.Done > n {
		return Retry{Reason: fmt.Sprintf("kumi: DoneUpTo(%d, …) outside a batch of %d events: %v", partial.Done, n, partial.Err)}
	}
	if partial.Done == n || partial.Err == nil {
		if partial.Done < n { // DoneUpTo(i, nil): the rest is retried
			return BatchAck{Done: partial.Done, Committed: partial.Committed, Next: Retry{Reason: fmt.Sprintf("kumi: done up to event %d of %d", partial.Done, n)}}
		}
		return BatchAck{Done: n, Committed: partial.Committed}
	}
	if next, ok := replyFor(partial.Err).(Ack); ok {
		// ErrFenceLost, ErrAlreadyCommitted: the batch is done here.
		return BatchAck{Done: n, Committed: next.Committed || partial.Committed}
	}
	return BatchAck{Done: partial.Done, Committed: partial.Committed, Next: replyFor(partial.Err)}
}

// PartialError reports a batch handled up to, not including, event Done:
// the events before it are acked, and Err answers event Done (see
// [BatchHandlerFunc]). Make one with [DoneUpTo]; test for one with
// errors.As.
type PartialError struct {
	// Done is the index in Batch.Events of the first event not done.
	Done int
	// Err is event Done's error: nil retries from it, [Permanent]
	// dead-letters it, any other error retries from it with its text as
	// the reason.
	Err error
	// Committed says the Done events are committed with the checkpoint
	// ([CommitBatchWithCheckpoint] sets it).
	Committed bool
}

// DoneUpTo reports a batch handled up to, not including, Events[i]; err is
// event i's error (see [BatchHandlerFunc]).
func DoneUpTo(i int, err error) error { return &PartialError{Done: i, Err: err} }

// Error says where the batch stopped and why.
func (e *PartialError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("kumi: batch done up to event %d", e.Done)
	}
	return fmt.Sprintf("kumi: batch done up to event %d: %v", e.Done, e.Err)
}

// Unwrap returns event Done's error.
func (e *PartialError) Unwrap() error { return e.Err }

// CommitBatchWithCheckpoint is [CommitWithCheckpoint] for a batch: it runs
// fn in a transaction that also moves the bucket's checkpoint to the
// batch's last event, and commits both only if the batch's fence still
// holds. Inside the transaction, after the fence, it locks the checkpoint
// row, and gives fn only the events the checkpoint does not already cover
// (an earlier attempt, or a worker that lost the bucket before its answer,
// committed the others); when it covers them all, fn is not run and
// [ErrAlreadyCommitted] is returned.
//
// When fn returns [DoneUpTo](i, err) (i indexing the events fn was given),
// the transaction is rolled back and fn runs again, in a new one, on the
// events before i, which then commit with the checkpoint at the last of
// them; the error returned is a *PartialError with Committed set, indexing
// b.Events, so that a [BatchFunc] returning it acks those events as
// committed and retries or dead-letters the next. Any other error of fn
// rolls back the whole batch, which is retried. A lost fence returns an
// error wrapping [eventsource.ErrFenceLost]. A BatchFunc simply returns
// what it returns.
func CommitBatchWithCheckpoint(ctx context.Context, store *eventsource.Store, b *Batch, fn func(ctx context.Context, tx pgx.Tx, events []eventsource.RecordedEvent) error) error {
	if b == nil || b.Fence == nil || len(b.Events) == 0 {
		return fmt.Errorf("kumi: CommitBatchWithCheckpoint needs a batch with a fence and events")
	}
	if b.d != nil && !b.d.exclusive {
		return invalid("GroupOptions.MaxInFlight", ">1", "CommitBatchWithCheckpoint needs MaxInFlight 1 (the default)")
	}
	if b.d != nil && b.d.release != nil {
		return commitReleasedBatch(ctx, store, b, fn)
	}
	events, skipped := b.Events, 0
	var partial *PartialError
	err := commitEvents(ctx, store, b, func(stored int64) []eventsource.RecordedEvent {
		for skipped < len(events) && events[skipped].Position <= stored {
			skipped++
		}
		return events[skipped:]
	}, func(c context.Context, tx pgx.Tx, evs []eventsource.RecordedEvent) error {
		err := fn(c, tx, evs)
		if !errors.As(err, &partial) {
			return err
		}
		switch p := partial; {
		case p.Done == len(evs) && p.Err == nil: // all done after all
			partial = nil
			return nil
		case p.Done < 0 || p.Done >= len(evs):
			partial = nil
			return fmt.Errorf("kumi: DoneUpTo(%d, …) outside the %d events given: %v", p.Done, len(evs), p.Err)
		}
		return err // rolled back; the prefix is committed below
	})
	if partial == nil {
		return err
	}
	done := skipped + partial.Done
	if partial.Done > 0 {
		prefix := events[skipped:done]
		if err := commitEvents(ctx, store, b, func(stored int64) []eventsource.RecordedEvent {
			for len(prefix) > 0 && prefix[0].Position <= stored {
				prefix = prefix[1:]
			}
			return prefix
		}, fn); err != nil && !errors.Is(err, ErrAlreadyCommitted) {
			// Nothing of this attempt committed: the batch is retried.
			if errors.As(err, new(*PartialError)) {
				return fmt.Errorf("kumi: committing the batch's first %d events: %v", done, err)
			}
			return err
		}
	}
	return &PartialError{Done: done, Err: partial.Err, Committed: true}
}

// commitEvents runs fn, in one fenced transaction that locks the bucket's
// checkpoint row, on the events pick leaves given the stored checkpoint,
// and moves the checkpoint to the last of them.
func commitEvents(ctx context.Context, store *eventsource.Store, b *Batch, pick func(stored int64) []eventsource.RecordedEvent,
	fn func(context.Context, pgx.Tx, []eventsource.RecordedEvent) error) error {
	return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		if err := b.Fence.Check(ctx, tx); err != nil {
			return err
		}
		stored, err := store.LockCheckpointTx(ctx, tx, b.Subscription, eventsource.Slot(b.Generation, b.Bucket))
		if err != nil {
			return err
		}
		evs := pick(stored)
		if len(evs) == 0 {
			return ErrAlreadyCommitted
		}
		if err := fn(ctx, tx, evs); err != nil {
			return err
		}
		_, err = store.SaveCheckpointTx(ctx, tx, b.Subscription, eventsource.Slot(b.Generation, b.Bucket), evs[len(evs)-1].Position, nil)
		return err
	})
}
