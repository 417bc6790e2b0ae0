package actors

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/checkpointing"
	wstate "github.com/kumi-run/kumi/internal/window"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// The delivery window as a state machine. A reader of single deliveries
// (MaxInFlight above 1) or of batches keeps its window in a window.State
// (internal/window): the state machine decides what is admitted, sent,
// retried, given up, dead-lettered and finished, and when a drain ends;
// the reader feeds it its inputs — the pending events, the handler's
// answers, the clock, lease checks, probes, handler stops and spawns, dead
// letters written — and carries out the effects it gives back (see wdo).
// The other readers (MaxInFlight 1 without batches, where a function
// handler takes runs) still thread the window by hand (deliver.go).

// wsent is a delivery with the handler: its Delivery, allocated with it,
// and what the reader ends when the answer comes or the window gives it
// up.
type wsent struct {
	d   Delivery
	wid uint64 // the window's id of its slot
	// batch are a batch's events (nil for a single delivery), the
	// first d.Event.
	batch  []eventsource.RecordedEvent
	span   observability.DeliverySpan
	cancel context.CancelFunc
	sentAt time.Time
}

// windowed is the reader's state beside its window.State.
type windowed struct {
	st *wstate.State
	// held are the events of the window's slots, in position order: a
	// Send names its event by position.
	held []eventsource.RecordedEvent
	// out are the deliveries with the handler, by Delivery id.
	out map[uint64]*wsent
	// hno is the window's number of the reader's handler; probe the
	// window's number of the probe out (r.probe its process-unique
	// sequence).
	hno, probe uint64
	drained    bool // the window's drain ended (Effects.Drained)
	scratch    []wstate.Event
}

// wired reports whether the reader's window is a window.State.
func (r *reader) wired() bool { return r.ws.st != nil }

// wireWindow builds the reader's window.State from the group's options,
// for single deliveries and batches.
func (r *reader) wireWindow() {
	o := r.g.opts
	if !o.Batch.on() && o.MaxInFlight <= 1 {
		return
	}
	backoff := o.Retry.Backoff
	r.ws = windowed{
		st: wstate.New(wstate.Config{MaxInFlight: o.MaxInFlight, MaxAttempts: o.Retry.MaxAttempts,
			Timeout: o.HandlerTimeout, ProbeWait: r.probeWait(), Backoff: backoff.Next,
			Batch: wstate.Batch{MaxEvents: o.Batch.MaxEvents, MaxBytes: o.Batch.MaxBytes}}),
		out: map[uint64]*wsent{},
	}
}

// wevent returns the held event at pos.
func (r *reader) wevent(pos int64) eventsource.RecordedEvent { return r.ws.held[r.wheldAt(pos)] }

// wheldAt is the index of the held event at pos.
func (r *reader) wheldAt(pos int64) int {
	h := r.ws.held
	i := sort.Search(len(h), func(i int) bool { return h[i].Position >= pos })
	if i == len(h) || h[i].Position != pos {
		panic(fmt.Sprintf("kumi: bucket %d: the window names position %d, not held", r.bucket, pos))
	}
	return i
}

// wpump takes the pending events the window has room for, within the
// resize bound.
func (r *reader) wpump(ctx actor.Context) {
	room := r.ws.st.Room()
	if room == 0 {
		return
	}
	pending := r.feed.Pending()
	n := 0
	for n < len(pending) && n < room && !r.beyondBound(pending[n].Position) {
		n++
	}
	if n == 0 {
		return
	}
	evs := r.ws.scratch[:0]
	for _, e := range pending[:n] {
		we := wstate.Event{Pos: e.Position, Stream: e.Stream, Err: e.Err, Size: eventSize(e)}
		if c := r.carried; c != nil && e.Position >= c.pos {
			if e.Position == c.pos {
				we.Attempt, we.Free = c.attempt, c.free // a retry its predecessor left (see leftRetry)
				if c.letter != nil {
					we.Letter = &wstate.Letter{Reason: c.letter.Reason, Attempts: c.letter.Attempts}
				}
			}
			r.carried = nil
		}
		evs = append(evs, we)
	}
	took, e := r.ws.st.Take(evs)
	clear(evs)
	r.ws.scratch = evs[:0]
	r.ws.held = append(r.ws.held, r.feed.Take(took)...)
	r.wdo(ctx, e)
}

// wdo carries out the window's effects, in order: the finished prefix to
// the checkpoint side, then the rest; a lease check is answered at once
// (EnsureHeld), and what its answer gives carried out in turn.
func (r *reader) wdo(ctx actor.Context, e wstate.Effects) {
	if f := e.Finished; f.Events > 0 {
		// A batch's slot counts its events: held drops as many.
		k := copy(r.ws.held, r.ws.held[f.Events:])
		clear(r.ws.held[k:])
		r.ws.held = r.ws.held[:k]
		r.cpDo(ctx, r.cp.Finished(checkpointing.Ack{Through: f.Through, Events: f.Events, Committed: f.Committed}))
	}
	if n := len(e.PutBack); n > 0 {
		// A batch's events after its first, not finished: the last held.
		k := len(r.ws.held) - n
		r.feed.PutBack(r.ws.held[k:]) // copied
		clear(r.ws.held[k:])
		r.ws.held = r.ws.held[:k]
	}
	if e.Absorbed > 0 {
		r.ws.held = append(r.ws.held, r.feed.Take(e.Absorbed)...)
	}
	var late *wsent
	for _, g := range e.GivenUp {
		if ws := r.wgiveUp(g, &e); late == nil && g.Late {
			late = ws
		}
	}
	for _, s := range e.Sends {
		r.wsend(ctx, s)
	}
	for _, d := range e.Redeliver {
		r.after(ctx, time.Until(d.At), &redeliver{inc: r, id: d.ID, attempt: d.Attempt})
	}
	for _, l := range e.Letters {
		r.wletter(ctx, l)
	}
	if e.Probe != 0 && r.handler != nil {
		r.probe, r.probeAt, r.ws.probe = answerIDs.Add(1), time.Now(), e.Probe
		if late != nil {
			r.probeFor = lateDelivery{id: late.d.Event.ID.String(), stream: late.d.Event.Stream,
				position: late.d.Event.Position, attempt: late.d.Attempt, sentAt: late.sentAt}
		}
		ctx.Send(r.handler, &handlerProbe{seq: r.probe, replyTo: ctx.Self()})
	}
	if e.Replace != nil {
		r.wreplace(ctx, e.Replace)
	}
	if e.Drained {
		r.ws.drained = true
	}
	if e.SpawnNow && r.handler == nil {
		r.spawnHandler(ctx)
		r.wdo(ctx, r.ws.st.HandlerSpawned())
	}
	if e.CheckLease {
		// Every delivery, a retry's as a first one's, needs a lease it
		// can trust.
		err := r.g.leases.EnsureHeld(r.bucket)
		if err != nil {
			r.markUnsure(err)
		}
		r.wdo(ctx, r.ws.st.Lease(time.Now(), err == nil, r.wpending()))
	}
}

// wpending is the pending list a batch sent may take from, cut before
// the first event beyond the resize bound: as many as a batch takes at
// most (nil without batches, where the window does not look).
func (r *reader) wpending() []wstate.Event {
	most := r.g.opts.Batch.MaxEvents - 1
	if most <= 0 {
		return nil
	}
	pending := r.feed.Pending()
	evs := r.ws.scratch[:0]
	for _, e := range pending[:min(most, len(pending))] {
		if r.beyondBound(e.Position) {
			break
		}
		evs = append(evs, wstate.Event{Pos: e.Position, Stream: e.Stream, Err: e.Err, Size: eventSize(e)})
	}
	r.ws.scratch = evs
	return evs
}

// wstep carries out an input's effects, then takes what the window has
// room for and checks the drains (see pump).
func (r *reader) wstep(ctx actor.Context, e wstate.Effects) {
	r.wdo(ctx, e)
	r.pump(ctx)
}

// wsend delivers an event to the handler, as the window says.
func (r *reader) wsend(ctx actor.Context, s wstate.Send) {
	ws := &wsent{wid: s.ID, sentAt: time.Now()}
	ws.d = Delivery{Event: r.wevent(s.Pos), Attempt: s.Attempt, Subscription: r.g.opts.Subscription, Generation: r.generation,
		Bucket: r.genBucket, Epoch: r.epoch, Fence: r.fence, id: answerIDs.Add(1), exclusive: r.g.opts.MaxInFlight == 1,
		replyTo: ctx.Self()}
	// Not a child of r.bg: the reader cancels every delivery context
	// itself (see window.cancel).
	c, span := r.g.telemetry.startDelivery(context.Background(), &ws.d)
	ws.span = span
	ws.d.Context, ws.cancel = context.WithCancel(c)
	r.ws.out[ws.d.id] = ws
	if n := len(s.Events); n > 0 {
		i := r.wheldAt(s.Pos)
		ws.batch = append(make([]eventsource.RecordedEvent, 0, n), r.ws.held[i:i+n]...)
		d := &ws.d
		ctx.Request(r.handler, &Batch{Events: ws.batch, Attempt: d.Attempt, Subscription: d.Subscription,
			Generation: d.Generation, Bucket: d.Bucket, Epoch: d.Epoch, Fence: d.Fence, Context: d.Context, d: d})
		return
	}
	ctx.Request(r.handler, &ws.d)
}

// wletterOf is the dead letter of the held event at pos.
func (r *reader) wletterOf(pos int64, reason string, attempts int) eventsource.DeadLetter {
	ev := r.wevent(pos)
	return eventsource.DeadLetter{Subscription: r.g.opts.Subscription, Generation: r.generation, Bucket: r.genBucket,
		EventID: ev.ID, Position: ev.Position, Stream: ev.Stream, Reason: reason, Attempts: attempts}
}

// wletter writes a dead letter the window asks for; its answer names the
// window's slot.
func (r *reader) wletter(ctx actor.Context, l wstate.Letter) {
	dl, id := r.wletterOf(l.Pos, l.Reason, l.Attempts), l.ID
	r.async(ctx, func(c context.Context) any {
		_, err := r.g.store.AddDeadLetter(c, dl)
		return &deadLettered{inc: r, id: id, err: err}
	})
}

// wgiveUp ends a delivery the window no longer waits for: late (a failed
// attempt; e says whether it spent the event's budget), or sent again to
// a replaced handler's successor.
func (r *reader) wgiveUp(g wstate.GivenUp, e *wstate.Effects) *wsent {
	var ws *wsent
	for _, o := range r.ws.out {
		if o.wid == g.ID && o.d.Attempt == g.Attempt {
			ws = o
			break
		}
	}
	if ws == nil {
		return nil
	}
	delete(r.ws.out, ws.d.id)
	ws.cancel()
	if !g.Late {
		ws.span.End(observability.OutcomeCancelled, nil)
		return ws
	}
	a := classifyAnswer(nil, errHandlerTimeout, r.g.opts.HandlerTimeout)
	r.warnAnswer(a.warn, &ws.d, nil)
	if l, dead := letterAt(e, ws.d.Event.Position); dead {
		ws.span.End(observability.OutcomeDeadLetter, errors.New(l.Reason))
	} else {
		ws.span.End(a.outcome, errors.New(a.reason))
	}
	return ws
}

// letterAt returns the dead letter e writes for the event at pos, if
// any.
func letterAt(e *wstate.Effects, pos int64) (wstate.Letter, bool) {
	for _, l := range e.Letters {
		if l.Pos == pos {
			return l, true
		}
	}
	return wstate.Letter{}, false
}

// wanswer gives the window a handler's answer.
func (r *reader) wanswer(ctx actor.Context, m *handlerReply) {
	ws := r.ws.out[m.id]
	if ws == nil || m.attempt != ws.d.Attempt || r.stopped {
		return // an answer to an attempt given up on (timeout), or to a stopped reader
	}
	delete(r.ws.out, m.id)
	ws.cancel()
	var wa wstate.Answer
	var a replyMeaning
	head := ws.d.Event.Position // the event the answer's outcome is of
	if ws.batch != nil {
		wa, a, head = r.wbatchAnswer(ws, m.msg)
	} else {
		a = classifyAnswer(m.msg, nil, r.g.opts.HandlerTimeout)
		wa = wstate.Answer{Outcome: outcomeOf(a), After: a.after, Reason: a.reason, Committed: a.committed}
	}
	if a.warn != "" {
		r.warnAnswer(a.warn, &ws.d, m.msg)
	}
	wa.ID, wa.Attempt, wa.Runs = ws.wid, ws.d.Attempt, m.runs
	e := r.ws.st.Answered(time.Now(), wa)
	o := outcomeOf(a)
	switch l, dead := letterAt(&e, head); {
	case o == wstate.Acked:
		ws.span.End(observability.OutcomeAck, nil)
	case dead:
		ws.span.End(observability.OutcomeDeadLetter, errors.New(l.Reason))
	case o == wstate.Panicked:
		ws.span.EndPanic(a.reason, nil)
	default:
		ws.span.End(a.outcome, errors.New(a.reason))
	}
	r.wstep(ctx, e)
}

// wreplace gives up on the handler, as the window says (its probe
// unanswered, or its stop), and spawns its successor after the group's
// retry backoff for the replacements in a row.
func (r *reader) wreplace(ctx actor.Context, rp *wstate.ReplaceHandler) {
	old := r.handler
	if old == nil {
		return
	}
	why := errHandlerStopped
	if rp.Hung != nil {
		late := r.probeFor
		waited := time.Since(late.sentAt)
		r.g.logger.Warn(msgHandlerHung, "bucket", r.bucket, "event_id", late.id,
			"stream", late.stream, "position", late.position, "attempt", late.attempt,
			"unanswered_for", waited, "handler_timeout", r.g.opts.HandlerTimeout, "handler", old.String())
		why = fmt.Errorf("%w: event %s (stream %s, position %d) unanswered for %v",
			errHandlerHung, late.id, late.stream, late.position, waited.Round(time.Millisecond))
	}
	r.handler, r.probe = nil, 0
	r.replacements++
	r.g.setReaderState(r.bucket, readerReplacingHandler)
	ctx.Unwatch(old)
	ctx.Stop(old)
	delay := r.g.opts.Retry.Backoff.Next(rp.Fails)
	r.g.observer("handler").Observe(supervision.Decision{
		Strategy: "reader", Supervisor: ctx.Self().String(), Child: old.String(), Class: supervision.Unknown,
		Directive: actor.RestartDirective, Reason: why, Time: time.Now(), Attempt: rp.Fails, Delay: delay,
		Targets: []string{old.String()},
	})
	r.after(ctx, delay, &respawnHandler{inc: r})
}

// markUnsure records a lease found unsure: the reader drains and stops
// (see unsureLease).
func (r *reader) markUnsure(err error) {
	if r.unsure != nil {
		return
	}
	r.g.telemetry.fenceLost(r.bucket, r.epoch, err)
	r.unsure = err
	r.draining = true
}

// wleft is the event the window leaves its successor at this epoch (see
// leftRetry).
func (r *reader) wleft() *leftRetry {
	if r.ws.st.Len() == 0 {
		return r.carried
	}
	l, ok := r.ws.st.Left()
	if !ok {
		return nil
	}
	left := &leftRetry{pos: l.Pos, attempt: l.Attempt, free: l.Free}
	if l.Letter != nil {
		dl := r.wletterOf(l.Pos, l.Letter.Reason, l.Letter.Attempts)
		left.letter = &dl
	}
	return left
}

// wcancel ends the contexts and spans of the deliveries with the handler
// as the reader stops.
func (r *reader) wcancel() {
	for id, ws := range r.ws.out {
		ws.cancel()
		ws.span.End(observability.OutcomeCancelled, nil)
		delete(r.ws.out, id)
	}
}

// wdeadLettered takes a dead letter's write: written, its slot finishes;
// failed, it is written again in place (see retryInPlace), or the reader
// fails.
func (r *reader) wdeadLettered(ctx actor.Context, m *deadLettered) {
	if r.stopped {
		return
	}
	if m.err != nil {
		err := fmt.Errorf("kumi: bucket %d: dead-letter: %w", r.bucket, m.err)
		r.wdo(ctx, r.ws.st.LetterFailed(m.id))
		if r.retryInPlace(ctx, err, &rewriteDeadLetter{inc: r, id: m.id}) {
			return
		}
		panic(err)
	}
	r.storeFailures = 0
	r.wstep(ctx, r.ws.st.LetterWritten(m.id))
}

// inFlight is how many events the reader's window holds.
func (r *reader) inFlight() int {
	if r.wired() {
		return r.ws.st.Len()
	}
	return len(r.win.entries)
}

// outcomeOf is the window's outcome of a single delivery's answer.
func outcomeOf(a replyMeaning) wstate.Outcome {
	switch a.outcome {
	case observability.OutcomeAck:
		return wstate.Acked
	case observability.OutcomeDeadLetter:
		return wstate.DeadLettered
	case observability.OutcomePanic:
		return wstate.Panicked
	}
	return wstate.Retry
}

// wbatchAnswer reads a batch's answer for the window (see
// classifyBatchAnswer): all done; a prefix done and the answer for the
// first not done; or a failure as a whole. a is the meaning of the answer
// for the event at head — the first not done — for its span and logs.
func (r *reader) wbatchAnswer(ws *wsent, res any) (wa wstate.Answer, a replyMeaning, head int64) {
	n := len(ws.batch)
	m := classifyBatchAnswer(res, n)
	switch {
	case m.all:
		return wstate.Answer{Outcome: wstate.BatchAcked, Done: n, Committed: m.committed},
			replyMeaning{outcome: observability.OutcomeAck, warn: m.warn}, ws.batch[n-1].Position
	case m.alone:
		a = classifyAnswer(m.next, nil, r.g.opts.HandlerTimeout)
		if a.outcome != observability.OutcomePanic {
			a.outcome = observability.OutcomeRetry // a whole failure is a retry
		}
		wa = wstate.Answer{Outcome: outcomeOf(a), After: a.after, Reason: a.reason}
		head = ws.batch[0].Position
	default:
		a = classifyAnswer(m.next, nil, r.g.opts.HandlerTimeout)
		wa = wstate.Answer{Outcome: wstate.BatchAcked, Done: m.done, Committed: m.committed, Next: outcomeOf(a),
			After: a.after, Reason: a.reason, NextCommitted: a.committed}
		head = ws.batch[m.done].Position
	}
	if m.warn != "" {
		a.warn = m.warn
	}
	return wa, a, head
}
