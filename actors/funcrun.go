package actors

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/observability"
)

// Runs: the one-at-a-time path of function handlers ([Func], [Typed],
// [Router]) with MaxInFlight 1 and no batches — the defaults.
//
// An actor handler is sent one *Delivery per event and answers each: two
// actor messages per event, each a mailbox run on another goroutine. A
// function handler needs neither: the reader sends its handler actor a run,
// the events that follow in the bucket's pending list (one entry of the
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
	// (the entry's, within the bound when it entered the window).
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

// sendRun sends an entry to a function handler as a run: its event and the
// pending events that follow, up to the first the single path would not
// send now — one beyond the resize bound (see beyondBound), or an
// unreadable one (dead-lettered on its own, as the first of an entry) — and
// at most runEvents.
func (r *reader) sendRun(ctx actor.Context, s *entry) {
	n, most, pending := 0, r.runEvents(), r.feed.Pending()
	for n < len(pending) && n+1 < most && pending[n].Err == nil && !r.beyondBound(pending[n].Position) {
		n++
	}
	evs := make([]eventsource.RecordedEvent, 0, n+1)
	evs = append(append(evs, s.d.Event), r.feed.Take(n)...)
	now := time.Now()
	s.batch, s.state, s.sentAt, s.to = evs, entrySent, now, r.handler
	s.run = &run{d: s.d, events: evs, held: r.g.leases.EnsureHeld, slot: r.bucket, tel: r.g.telemetry, until: now.Add(r.tick),
		limit: r.runLimit()}
	ctx.Send(r.handler, s.run)
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
	for _, s := range r.win.entries {
		if s.run != nil {
			s.run.mu.Lock()
			s.run.limit = r.runLimit()
			s.run.mu.Unlock()
		}
	}
}

// takesRuns reports whether the reader sends its handler runs: a function
// handler (it said so in its first answer), one event in flight, no
// batches.
func (r *reader) takesRuns() bool {
	return r.win.runs && r.g.opts.MaxInFlight == 1 && !r.g.opts.Batch.on()
}

// endRun ends an entry's run and applies what the handler finished: the
// acked prefix moves the acked position (the entry finishes when all its
// events are done: finished is true), the first event not done becomes
// the entry's, the events after it go back to the front of the pending
// list.
func (r *reader) endRun(ctx actor.Context, s *entry) (o runOutcome, finished bool) {
	o = s.run.end()
	s.run = nil
	if o.done == len(s.batch) {
		r.finish(ctx, s, o.committed)
		return o, true
	}
	if o.done > 0 {
		r.ackPrefix(ctx, s, o.done, o.committed)
	}
	r.unbatch(s)
	return o, false
}

// onRunAnswer acts on a run's answer. An event not acked is answered for as
// a single delivery (next); a run cut short leaves its first event not done
// waiting, uncharged.
func (r *reader) onRunAnswer(ctx actor.Context, s *entry) (next any, settled bool) {
	o, finished := r.endRun(ctx, s)
	if finished {
		return nil, true
	}
	if o.next == nil {
		r.unsend(s)
		if o.unsure != nil {
			r.unsureLease(ctx, o.unsure)
			return nil, true
		}
		r.pump(ctx)
		return nil, true
	}
	s.span = o.span
	return o.next, false
}

// unsend puts an entry whose event was not handled back to waiting.
func (r *reader) unsend(s *entry) {
	s.state = entryWaiting
	delete(r.win.busy, s.d.Event.Stream)
}

// timeoutRun times out a run whose event in hand is late: the events before
// it are acked, it is the entry's event, its span the entry's. It reports
// whether the entry's event is late (the caller times it out); a run whose
// handler answered or moved on in the meantime is left or settled.
func (r *reader) timeoutRun(ctx actor.Context, s *entry, now time.Time) bool {
	since, inHand := s.run.lateSince()
	if !inHand || now.Sub(since) < r.g.opts.HandlerTimeout {
		return false
	}
	o, finished := r.endRun(ctx, s)
	switch {
	case finished:
		return false
	case o.inHand:
		s.span, s.sentAt = o.span, since
		return true
	case o.next != nil: // answered just now: its answer is dropped (the run is no longer the entry's)
		s.span = o.span
		r.onReply(ctx, s, o.next, nil)
	default:
		r.unsend(s)
		r.pump(ctx)
	}
	return false
}
