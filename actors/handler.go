package actors

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/supervisor"
)

// Delivery is the message a Handler actor receives for each event. The
// handler must answer it with ctx.Respond and one of [Ack], [Retry] or
// [DeadLetter]. A panic while handling it, or no answer within the group's
// HandlerTimeout, counts as a [Retry].
//
// When a delivery goes unanswered for HandlerTimeout, the reader probes
// its handler (kumi's middleware answers on the handler's goroutine, the
// user's code never sees it) and sends it nothing meanwhile. A handler that
// answers is alive — slow with that one event, or it dropped it — and gets
// the retry. One that does not within HandlerTimeout/2 (at most 5 s) is
// taken for hung: its reader stops it (the stop takes effect when its call
// returns, if ever), logs it at Warn, and delivers to a new handler made
// from the same props — the retry of the late event, and again, without
// spending their retry budget, the other events it had not answered. A
// handler that stops (itself, or its supervisor once its restart budget is
// spent) is replaced the same way. Replacements are spaced by the group's
// retry backoff. So no handler ever has more than MaxInFlight deliveries
// queued.
type Delivery struct {
	// Event is the event to handle.
	Event eventsource.RecordedEvent
	// Attempt counts deliveries of this event: 0 the first time, 1 after
	// the first retry, and so on.
	Attempt int
	// Subscription, Generation and Bucket say whose delivery this is:
	// Bucket is the bucket within Generation, the generation of the
	// subscription's buckets (0 until it is first resized, see
	// docs/design/resize.md). A bucket number means another set of streams in
	// another generation: a handler that keys state by Bucket must key it
	// by (Generation, Bucket). The checkpoint is the slot's,
	// eventsource.Slot(Generation, Bucket).
	Subscription string
	Generation   int
	Bucket       int
	// Epoch is the lease epoch under which the bucket is held.
	Epoch int64
	// Fence guards writes made on behalf of this delivery: pass it to
	// [CommitWithCheckpoint] (or check it in your own transaction) so that a
	// worker that lost the bucket cannot commit.
	Fence eventsource.Fence
	// Context carries the delivery's trace span, a child of the trace that
	// appended the event. Use it for the handler's own spans and calls. It
	// is cancelled once the reader is done with this attempt: after its
	// answer (for the events of a function handler's run, once the run
	// ends: see [Func]), when HandlerTimeout passes without one (the reader
	// then gives up on the handler and replaces it), or when the reader
	// stops.
	Context context.Context

	id        uint64
	replyTo   *actor.PID
	exclusive bool // MaxInFlight is 1: no other event of the bucket is in flight
	// release is set on a released parked stream's event (see release.go).
	release *parkedStep
}

// Respond answers the delivery from outside its handling: a handler that
// finishes an event later (after work of its own) keeps the *Delivery and
// calls d.Respond(ctx, Ack{}) from whatever message it is handling then.
// While handling the Delivery itself, plain ctx.Respond does the same.
func (d *Delivery) Respond(ctx actor.SenderContext, reply any) {
	ctx.Send(d.replyTo, &handlerReply{id: d.id, attempt: d.Attempt, msg: reply})
}

// handlerReply is a handler's answer, tagged with the delivery it answers
// (its id, unique in the process: see answerIDs) so that a late answer to
// an earlier attempt, or to a delivery of the reader's earlier
// incarnation, is never taken for the current one.
type handlerReply struct {
	id      uint64
	attempt int
	msg     any
	runs    bool // the handler takes runs (see funcrun.go)
}

// Ack reports that the event was handled; the checkpoint may move past it.
type Ack struct {
	// Committed says the handler already committed the checkpoint with its
	// own writes (see [CommitWithCheckpoint]).
	Committed bool
}

// Retry asks for the event to be delivered again after a delay, within the
// group's retry policy; when the policy's attempts are spent the event is
// dead-lettered.
type Retry struct {
	After  time.Duration
	Reason string
}

// DeadLetter records the event in the dead-letter table and moves on.
type DeadLetter struct {
	Reason string
}

// handlerPanicked answers a delivery whose handling panicked, so the
// reader retries at once instead of waiting for the timeout.
type handlerPanicked struct {
	reason any
}

// panicReporter answers the reader of a delivery whose handling panicked,
// then lets the panic go on to the supervisor, which restarts the handler.
// A delivery handled without a panic is a success for the supervisor: the
// handler's next panic restarts it with the first backoff again.
func panicReporter(supervisor *supervisor.Strategy) actor.ReceiverMiddleware {
	return func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			d := deliveryOf(env.Message)
			if d == nil {
				next(c, env)
				return
			}
			defer func() {
				if r := recover(); r != nil {
					c.ActorSystem().Root.Send(d.replyTo, &handlerReply{id: d.id, attempt: d.Attempt, msg: &handlerPanicked{reason: r}})
					panic(r)
				}
			}()
			next(c, env)
			supervisor.Succeeded(c.Self())
		}
	}
}

// deliveryOf returns the delivery a handler's message answers to: the
// *Delivery itself, or a *Batch's first event's; nil for other messages.
func deliveryOf(msg any) *Delivery {
	switch m := msg.(type) {
	case *Delivery:
		return m
	case *Batch:
		return m.d
	}
	return nil
}

// handlerProbe asks whether a handler's goroutine is free: probeAnswerer
// answers it on that goroutine, before the user's code sees any message,
// so only a handler stuck in a call (or suspended) leaves it unanswered.
type handlerProbe struct {
	seq     uint64
	replyTo *actor.PID
}

// probeAnswer answers a handlerProbe.
type probeAnswer struct{ seq uint64 }

// answerIDs numbers deliveries (Delivery.id) and probes (handlerProbe.seq),
// whose answers carry the number back to the reader. The numbers are
// unique in the process, not per reader: a supervisor restarts a reader
// with the same PID and mailbox, where the answers of its predecessor's
// handler — an Ack that comes late, a probe's answer — still arrive.
// Numbered per incarnation, such an answer matched a slot of the new
// incarnation: an Ack finished a delivery whose event no handler had
// acked (and cancelled its context), and the checkpoint moved past it
// (TestRestartedReaderIgnoresItsPredecessorsAnswers).
var answerIDs atomic.Uint64

// probeAnswerer answers kumi's probes in place of the user's handler.
func probeAnswerer(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		if p, ok := env.Message.(*handlerProbe); ok {
			c.ActorSystem().Root.Send(p.replyTo, &probeAnswer{seq: p.seq})
			return
		}
		next(c, env)
	}
}

// replyTagger tags what a handler sends to its reader while it handles a
// Delivery (ctx.Respond) with that delivery.
func replyTagger(next actor.SenderFunc) actor.SenderFunc {
	return func(c actor.SenderContext, target *actor.PID, env *actor.MessageEnvelope) {
		if d := deliveryOf(c.Message()); d != nil && target.Equal(d.replyTo) {
			if _, tagged := env.Message.(*handlerReply); !tagged {
				env.Message = &handlerReply{id: d.id, attempt: d.Attempt, msg: env.Message}
			}
		}
		next(c, target, env)
	}
}

// handlerProps returns a copy of the user's props with kumi's panic
// reporter, reply tagger, supervisor and dispatcher. A handler is spawned
// at the top level, supervised by its guardian, and watched by its reader
// rather than parented by it: a reader can then stop, restart or replace
// its handler without waiting for a handler call that never returns.
func handlerProps(user *actor.Props, supervisor *supervisor.Strategy, d actor.Dispatcher) *actor.Props {
	p := *user
	return p.Configure(actor.WithReceiverMiddleware(probeAnswerer, panicReporter(supervisor)), actor.WithSenderMiddleware(replyTagger),
		actor.WithSupervisor(supervisor), actor.WithGuardian(supervisor), actor.WithDispatcher(d))
}

// CommitWithCheckpoint runs fn in a transaction that also moves the
// delivery's checkpoint to its event, and commits both only if the delivery's
// fence still holds. A projection that writes to the same database through
// it is exactly-once: a worker that lost the bucket cannot commit, the next
// owner starts after the committed checkpoint, and an event's effect is
// committed at most once whatever the timing of timeouts, retries, panics
// and late answers. Respond with Ack{Committed: true} afterwards.
//
// Inside the transaction, after the fence, it locks the bucket's checkpoint
// row (creating it if missing), so that two attempts at the same event — a
// retry sent while an earlier attempt is still committing, a handler that
// panicked after its commit — run one after the other. When the checkpoint
// already covers the event, fn is not run and [ErrAlreadyCommitted] is
// returned: the effect is committed; respond with Ack{Committed: true}.
//
// A lost fence returns an error wrapping [eventsource.ErrFenceLost]: respond
// with Ack as well (the new owner will redo the event), or simply return.
func CommitWithCheckpoint(ctx context.Context, store *eventsource.Store, d *Delivery, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if d == nil || d.Fence == nil {
		return fmt.Errorf("kumi: CommitWithCheckpoint needs a delivery with a fence")
	}
	if !d.exclusive {
		// With several events of a bucket in flight, this event's position
		// may lie past an unfinished one: committing it would skip that one.
		return invalid("GroupOptions.MaxInFlight", ">1", "CommitWithCheckpoint needs MaxInFlight 1 (the default)")
	}
	if d.release != nil {
		return commitReleased(ctx, store, d, fn)
	}
	return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		if err := d.Fence.Check(ctx, tx); err != nil {
			return err
		}
		slot := eventsource.Slot(d.Generation, d.Bucket)
		stored, err := store.LockCheckpointTx(ctx, tx, d.Subscription, slot)
		if err != nil {
			return err
		}
		if stored >= d.Event.Position {
			return ErrAlreadyCommitted
		}
		if err := fn(ctx, tx); err != nil {
			return err
		}
		_, err = store.SaveCheckpointTx(ctx, tx, d.Subscription, slot, d.Event.Position, nil)
		return err
	})
}

// ErrAlreadyCommitted is returned by [CommitWithCheckpoint] when the
// bucket's checkpoint already covers the delivery's event: an earlier
// attempt committed its effect, which is not applied again. Answer
// Ack{Committed: true}.
var ErrAlreadyCommitted = errors.New("kumi: the event is already committed for this subscription (an earlier attempt committed it)")
