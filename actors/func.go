package actors

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
)

// HandlerFunc handles one delivery; [Func] turns it into the Handler of a
// group. What it returns is the answer:
//
//   - nil acks the event;
//   - an error wrapping a [*PermanentError] (see [Permanent]) dead-letters
//     the event at once, the error's text as the reason;
//   - any other error retries the event under the group's [RetryPolicy],
//     the error's text as the reason; once the attempts are spent the event
//     is dead-lettered with it;
//   - an error wrapping [eventsource.ErrFenceLost] acks: this worker lost
//     the bucket, and its new owner handles the event again;
//   - an error wrapping [ErrAlreadyCommitted] acks as committed: an earlier
//     attempt committed the event with its checkpoint.
//
// A panic counts as a retry whose reason says it panicked, with the panic's
// value and where it happened; the handler is not restarted.
//
// Exactly-once stays one call away: a function whose writes go to the
// event store's database returns what [CommitWithCheckpoint] returns, and
// its writes commit with the checkpoint, fenced, or not at all.
//
// ctx is the delivery's Context (d.Context): it carries the delivery's trace
// span, a child of the trace that appended the event, and is cancelled when
// the attempt is given up on (HandlerTimeout) or the reader stops.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// Func returns the props of a handler actor that calls fn for each
// delivery and answers with what fn returns (see [HandlerFunc]). Give it as
// a group's Handler:
//
//	actors.GroupOptions{..., Handler: actors.Func(handle)}
//
// With MaxInFlight 1 (the default) fn handles a bucket's events one at a
// time, on the handler actor, which the reader sends runs of events rather
// than one message per event (see docs/design/architecture.md: every guarantee
// holds per event). With MaxInFlight above 1 each call runs on a
// goroutine of its own, so that events of other streams go ahead while one
// is being handled; events of one stream are still handled one at a time,
// in order. Given batches (GroupOptions.Batch), fn handles a batch's
// events one at a time, in order, and the batch is answered up to the
// first event fn does not ack.
func Func(fn HandlerFunc) *actor.Props {
	if fn == nil {
		panic("kumi: actors.Func: nil HandlerFunc")
	}
	return actor.PropsFromProducer(func() actor.Actor { return &funcHandler{fn: fn} })
}

// funcHandler is the actor behind [Func].
type funcHandler struct {
	fn HandlerFunc
}

// Receive answers each delivery with fn's outcome.
func (h *funcHandler) Receive(c actor.Context) {
	// Answers go through the root context: they are tagged already, and
	// the handler's sender middleware would only wrap them in an envelope.
	root := c.ActorSystem().Root
	switch m := c.Message().(type) {
	case *Batch:
		m.Respond(root, h.answerBatch(m))
		return
	case *run:
		h.handle(root, m)
		return
	}
	d, ok := c.Message().(*Delivery)
	if !ok {
		return
	}
	if d.exclusive {
		// It says it takes runs: the reader sends the next events as runs.
		root.Send(d.replyTo, &handlerReply{id: d.id, attempt: d.Attempt, msg: h.answer(d), runs: true})
		return
	}
	go func() { d.Respond(root, h.answer(d)) }()
}

// answer runs fn and turns its outcome, or its panic, into the reply.
func (h *funcHandler) answer(d *Delivery) (reply any) {
	defer func() {
		if r := recover(); r != nil {
			reply = &handlerPanicked{reason: panicReason(r)}
		}
	}()
	ctx := d.Context
	if ctx == nil {
		ctx = context.Background()
	}
	return replyFor(h.fn(ctx, d))
}

// answerBatch handles a batch (Batch.MaxEvents set for a Func) one event
// at a time, in order, up to the first that is not acked.
func (h *funcHandler) answerBatch(b *Batch) any {
	committed := false
	for i, e := range b.Events {
		d := *b.d
		d.Event = e
		if i > 0 {
			d.Attempt = 0
		}
		reply := h.answer(&d)
		ack, ok := reply.(Ack)
		if !ok {
			return BatchAck{Done: i, Committed: committed, Next: reply}
		}
		committed = ack.Committed
	}
	return BatchAck{Done: len(b.Events), Committed: committed}
}

// The acks as answers, boxed once: converting an Ack to an interface
// allocates, and a function handler answers every event.
var (
	ackReply       any = Ack{}
	committedReply any = Ack{Committed: true}
)

// replyFor maps a HandlerFunc's error to the handler contract's answer.
func replyFor(err error) any {
	switch {
	case err == nil: // first, and before permanent: its address escapes, which costs an allocation
		return ackReply
	case errors.Is(err, ErrAlreadyCommitted): // an earlier attempt committed it
		return committedReply
	case errors.Is(err, eventsource.ErrFenceLost):
		return ackReply // the bucket's new owner redoes the event
	}
	if permanent := (*PermanentError)(nil); errors.As(err, &permanent) {
		return DeadLetter{Reason: permanent.Error()}
	}
	return Retry{Reason: err.Error()}
}

// PermanentError marks a handler's error as one that no retry cures (bad
// input, an event this service cannot apply): the event is dead-lettered
// at once. Make one with [Permanent]; test for one with errors.As.
type PermanentError struct {
	Err error
}

// Permanent wraps err so that a [HandlerFunc] returning it dead-letters the
// event at once, with err's text as the reason. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Error returns the wrapped error's text: the dead letter's reason.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// panicReason describes a recovered panic for the dead letter's reason:
// its value and the function and line that panicked.
func panicReason(r any) string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	panicking := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			panicking = true
		case panicking && !strings.HasPrefix(f.Function, "runtime."):
			return fmt.Sprintf("%v (in %s at %s:%d)", r, f.Function, filepath.Base(f.File), f.Line)
		}
		if !more {
			return fmt.Sprint(r)
		}
	}
}
