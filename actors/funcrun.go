package actors

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/window"
	"github.com/kumi-run/kumi/observability"
)

// Runs: the one-at-a-time path of function handlers ([Func], [Typed],
// [Router]) with MaxInFlight 1 and no batches — the defaults.
//
// An actor handler is sent one *Delivery per event and answers each: two
// actor messages per event, each a mailbox run on another goroutine. A
// function handler needs neither: the reader sends its handler actor a run,
// the events that follow in the bucket's pending list (one slot of the
// delivery window, as a batch is), and the handler calls the function for
// them one at a time, in order, each with a Delivery of its own, then
// answers once. Per event, on the handler's goroutine, it does what the
// reader does before and after each delivery: EnsureHeld, the kumi.deliver
// span and its counters, the delivery's context, and the function's
// answer. It stops at the first event the function does not ack and hands
// that event's answer (and open span) back: the reader acts on it as on the
// answer of a single delivery (retry, dead letter, panic), the events
// before it acked, those after it back to the front of the pending list.
//
// The run's state is shared under a mutex between the handler, which
// records each event it starts and finishes, and the reader, which may end
// the run at any time: on HandlerTimeout (measured from the start of the
// event in hand, as for a single delivery), when it replaces the handler,
// when it stops. Whoever comes first decides: once the handler has
// answered, the reader takes the answer; once the reader has ended the
// run, the handler answers nothing and starts no further event, and the
// reader acks the events the handler finished, times out the one in hand
// (or sends it again uncharged, after a replacement), and puts the rest
// back. A drain (handoff, graceful stop) or a run's time slice (the
// reader's tick) cuts it short between events: the reader acks what was
// done and keeps the rest, uncharged, for the next run or the next owner.

// maxRunEvents bounds a run's events: its answer carries the acks of at
// most this many events.
const maxRunEvents = 256

// run is a stretch of a bucket's events for a function handler (see above).
type run struct {
	d      *Delivery // the first event's delivery: the others are copies of it
	events []eventsource.RecordedEvent
	// held is EnsureHeld, asked for slot: the reader's lease and
	// checkpoint key, not the Delivery's Bucket (the bucket within its
	// generation, another slot's number after a resize).
	held  func(slot int) error
	slot  int
	tel   *telemetry
	until time.Time // no event is started after this, but the first

	mu sync.Mutex
	// limit is the reader's resize bound (beyondBound) as it was when the
	// reader last looked: no event beyond it is started, but the first
	// (the slot's, within the bound when it entered the window).
	limit     int64
	done      int  // events acked, from the first
	committed bool // the last acked event was committed with its checkpoint
	inHand    bool // an event is being handled
	startedAt time.Time
	span      observability.DeliverySpan // of the event in hand, or of the one not acked
	cancel    context.CancelFunc         // the run's context, its events' contexts' parent
	next      any                        // the answer for event done (nil: cut short)
	unsure    error                      // EnsureHeld failed before event done
	answered  bool                       // the handler answered: the reader takes the outcome
	ended     bool                       // the reader ended the run: the handler answers nothing
	cut       bool                       // start no further event (the reader drains)
}

// runOutcome is a run's state as the reader takes it.
type runOutcome struct {
	done      int
	committed bool
	inHand    bool // ended while an event was being handled (its span is span)
	span      observability.DeliverySpan
	next      any
	unsure    error
}

// end ends the run for the reader, unless the handler answered already, and
// returns its outcome: final either way.
func (ru *run) end() runOutcome {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	if !ru.answered && !ru.ended {
		ru.ended = true
		if ru.cancel != nil {
			ru.cancel()
		}
	}
	return runOutcome{done: ru.done, committed: ru.committed, inHand: ru.inHand && !ru.answered,
		span: ru.span, next: ru.next, unsure: ru.unsure}
}

// lateSince reports when the event in hand started, and whether one is in
// hand and unanswered.
func (ru *run) lateSince() (time.Time, bool) {
	ru.mu.Lock()
	defer ru.mu.Unlock()
	return ru.startedAt, ru.inHand && !ru.answered && !ru.ended
}

// cutShort asks the handler to start no further event.
func (ru *run) cutShort() {
	ru.mu.Lock()
	ru.cut = true
	ru.mu.Unlock()
}

// handle goes through the run's events on the handler's goroutine and
// answers the reader, unless the reader ended the run first.
func (h *funcHandler) handle(root *actor.RootContext, ru *run) {
	// One cancellable context for the run, the parent of each event's: the
	// reader's end cancels the event in hand through it, and the events'
	// contexts end with the run (a context per event cost an allocation
	// and a cancellation each).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i, e := range ru.events {
		d := *ru.d
		d.Event = e
		if i > 0 {
			d.Attempt = 0
		}
		err := ru.held(ru.slot)
		now := time.Now()
		ru.mu.Lock()
		if ru.ended {
			ru.mu.Unlock()
			return
		}
		if err != nil || ru.cut || (i > 0 && (e.Position > ru.limit || now.After(ru.until))) {
			ru.unsure = err
			break // answered below, with the lock held
		}
		var span observability.DeliverySpan
		d.Context, span = ru.tel.startDelivery(ctx, &d)
		ru.inHand, ru.startedAt, ru.span, ru.cancel = true, now, span, cancel
		ru.mu.Unlock()

		reply := h.answer(&d)

		ru.mu.Lock()
		ru.inHand = false
		if ru.ended {
			ru.mu.Unlock()
			return // the reader gave up on the event and ended its span
		}
		ack, ok := reply.(Ack)
		if !ok {
			ru.next = reply
			break
		}
		ru.done++
		ru.committed = ack.Committed
		ru.span = observability.DeliverySpan{}
		ru.mu.Unlock()
		span.End(observability.OutcomeAck, nil)
		ru.mu.Lock()
		if ru.ended {
			ru.mu.Unlock()
			return
		}
		if i == len(ru.events)-1 {
			break
		}
		ru.mu.Unlock()
	}
	ru.answered = true
	ru.mu.Unlock()
	root.Send(ru.d.replyTo, &handlerReply{id: ru.d.id, attempt: ru.d.Attempt, msg: ru})
}

// runEvents is the most events a run takes: maxRunEvents, and no more
// than CheckpointEvery, so that the checkpoint keeps the pace of single
// deliveries (a run's answer brings at most CheckpointEvery acks) and a
// crash repeats no more than they would.
func (r *reader) runEvents() int { return min(maxRunEvents, r.g.opts.CheckpointEvery) }

// runLimit is the position beyond which a run starts no event: the resize
// bound, if any.
func (r *reader) runLimit() int64 {
	if b := r.part.Bound(); b.Bounded {
		return b.Limit
	}
	return math.MaxInt64
}

// limitRuns gives a run in flight the reader's current resize bound, so
// that it starts no event the single path would not send now. Every change
// of the bound is followed by a pump, which calls this (the freeze at the
// cursor is not, and needs none: a run holds no event beyond the cursor).
func (r *reader) limitRuns() {
	if ws := r.runInFlight(); ws != nil {
		ws.run.mu.Lock()
		ws.run.limit = r.runLimit()
		ws.run.mu.Unlock()
	}
}

// runInFlight is the run with the handler, if one is (a run is the
// window's only slot: runs need MaxInFlight 1 and no batches, and no
// other reader looks through its deliveries for one).
func (r *reader) runInFlight() *wsent {
	if r.g.opts.MaxInFlight != 1 || r.g.opts.Batch.on() {
		return nil
	}
	for _, ws := range r.ws.out {
		if ws.run != nil {
			return ws
		}
	}
	return nil
}

// runProgress tells the window how far the run in flight is, before an
// input that may time it out or replace its handler.
func (r *reader) runProgress() {
	if ws := r.runInFlight(); ws != nil {
		since, inHand := ws.run.lateSince()
		r.ws.st.RunProgress(since, inHand)
	}
}

// runOutcome is a run's outcome as the window takes it.
func (r *reader) runOutcome(ws *wsent, o runOutcome) window.RunOutcome {
	ro := window.RunOutcome{Run: ws.runNo, Done: o.done, Committed: o.committed, InHand: o.inHand, Cut: o.next == nil,
		Unsure: o.unsure != nil}
	if o.next != nil {
		a := classifyAnswer(o.next, nil, r.g.opts.HandlerTimeout)
		ro.Next, ro.After, ro.Reason = outcomeOf(a), a.after, a.reason
	}
	return ro
}

// runAnswered gives the window a run's answer: its acked prefix finishes,
// the event not acked is answered for as a single delivery, a run cut
// short leaves its first event not done waiting, uncharged.
func (r *reader) runAnswered(ctx actor.Context, ws *wsent) {
	o := ws.run.end()
	e := r.ws.st.RunAnswered(time.Now(), r.runOutcome(ws, o))
	if o.unsure != nil {
		r.markUnsure(o.unsure) // EnsureHeld failed before the event not started
	}
	r.endRunSpan(ws, o, &e, false)
	r.wstep(ctx, e)
}

// endRun ends the run the window asks to end (its event in hand late, or
// its handler replaced) and gives the window its outcome.
func (r *reader) endRun(ctx actor.Context, er *window.EndRun) {
	ws := r.runInFlight()
	if ws == nil || ws.runNo != er.Run {
		return
	}
	delete(r.ws.out, ws.d.id)
	since, _ := ws.run.lateSince()
	o := ws.run.end()
	e := r.ws.st.RunEnded(time.Now(), r.runOutcome(ws, o))
	if er.Late && o.inHand && e.Probe != 0 {
		head := ws.batch[o.done]
		attempt := 0
		if o.done == 0 {
			attempt = ws.d.Attempt
		}
		r.probeFor = lateDelivery{id: head.ID.String(), stream: head.Stream, position: head.Position, attempt: attempt,
			sentAt: since}
	}
	r.endRunSpan(ws, o, &e, er.Late)
	r.wdo(ctx, e)
}

// endRunSpan ends the span of the run's event not acked, as the window
// took it (e): timed out, sent again uncharged, or answered.
func (r *reader) endRunSpan(ws *wsent, o runOutcome, e *window.Effects, late bool) {
	if o.done >= len(ws.batch) {
		return // all acked: the handler ended their spans
	}
	d := ws.d
	d.Event = ws.batch[o.done]
	if o.done > 0 {
		d.Attempt = 0
	}
	var a replyMeaning
	switch {
	case o.inHand && late:
		a = classifyAnswer(nil, errHandlerTimeout, r.g.opts.HandlerTimeout)
	case o.inHand:
		o.span.End(observability.OutcomeCancelled, nil)
		return
	case o.next != nil:
		a = classifyAnswer(o.next, nil, r.g.opts.HandlerTimeout)
	default:
		return // cut short before it: not started
	}
	if a.warn != "" {
		r.warnAnswer(a.warn, &d, o.next)
	}
	switch l, dead := letterAt(e, d.Event.Position); {
	case a.outcome == observability.OutcomeAck:
		o.span.End(observability.OutcomeAck, nil)
	case dead:
		o.span.End(observability.OutcomeDeadLetter, errors.New(l.Reason))
	case a.outcome == observability.OutcomePanic:
		o.span.EndPanic(a.reason, nil)
	default:
		o.span.End(a.outcome, errors.New(a.reason))
	}
}
