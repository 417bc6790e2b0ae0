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
	"github.com/kumi-run/kumi/internal/window"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// The delivery window. A reader keeps its window in a window.State
// (internal/window), a pure state machine of its rules: events admitted in
// position order, at most MaxInFlight slots, each sent when no earlier
// event of its stream is unfinished (so MaxInFlight 1 delivers strictly
// one at a time), only after a lease check; answers matched by delivery
// and attempt; retries and their budget; timeouts, probes and handler
// replacement; dead letters; the finished prefix, over which alone the
// checkpoint moves; what a drain still sends and when it ends; batches
// (GroupOptions.Batch) and a function handler's runs (funcrun.go) as
// slots of it. The reader feeds it its inputs — the pending events, the
// handler's answers, the clock, lease checks (EnsureHeld), probes,
// handler stops and spawns, dead letters written, drains, unsure leases —
// and carries out the effects it gives back (see wdo): deliveries,
// redeliveries, dead-letter writes, probes, handler replacements, the
// finished prefix to the checkpoint side (internal/checkpointing), the
// end of a drain.

// wsent is a delivery with the handler: its Delivery, allocated with it,
// and what the reader ends when the answer comes or the window gives it
// up.
type wsent struct {
	d   Delivery
	wid uint64 // the window's id of its slot
	// batch are a batch's events (nil for a single delivery), the
	// first d.Event.
	batch []eventsource.RecordedEvent
	// run, for a function handler's run (its events batch), and runNo
	// the window's number of it.
	run    *run
	runNo  uint64
	span   observability.DeliverySpan
	cancel context.CancelFunc
	sentAt time.Time
}

// release cancels the delivery's context, if it has one (a run has
// none: its handler makes one per event).
func (ws *wsent) release() {
	if ws.cancel != nil {
		ws.cancel()
		ws.cancel = nil
	}
}

// windowed is the reader's state beside its window.State.
type windowed struct {
	st *window.State
	// held are the events of the window's slots, in position order: a
	// Send names its event by position. Its finished prefix is cut off
	// its front; hbuf is the array it lives in (see hold).
	held, hbuf []eventsource.RecordedEvent
	// out are the deliveries with the handler, by Delivery id.
	out map[uint64]*wsent
	// hno is the window's number of the reader's handler; probe the
	// window's number of the probe out (r.probe its process-unique
	// sequence).
	hno, probe uint64
	drained    bool // the window's drain ended (Effects.Drained)
	scratch    []window.Event
}

// wireWindow builds the reader's window.State from the group's options.
func (r *reader) wireWindow() {
	o := r.g.opts
	backoff := o.Retry.Backoff
	r.ws = windowed{
		st: window.New(window.Config{MaxInFlight: o.MaxInFlight, MaxAttempts: o.Retry.MaxAttempts,
			Timeout: o.HandlerTimeout, ProbeWait: r.probeWait(), Backoff: backoff.Next,
			Batch:     window.Batch{MaxEvents: o.Batch.MaxEvents, MaxBytes: o.Batch.MaxBytes},
			RunEvents: r.runEvents()}),
		out: map[uint64]*wsent{},
	}
	if r.draining {
		// Restarted while draining (see coordinator.go's drain): the new
		// incarnation's window takes nothing, and its drain ends at once.
		r.ws.drained = r.ws.st.Drain().Drained
	}
}

// wevent returns the held event at pos.
func (r *reader) wevent(pos int64) eventsource.RecordedEvent { return r.ws.held[r.wheldAt(pos)] }

// wheldAt is the index of the held event at pos.
func (r *reader) wheldAt(pos int64) int {
	h := r.ws.held
	if n := len(h); n > 0 && h[n-1].Position == pos {
		return n - 1 // the event taken last, as a single delivery sent at once is
	}
	i := sort.Search(len(h), func(i int) bool { return h[i].Position >= pos })
	if i == len(h) || h[i].Position != pos {
		panic(fmt.Sprintf("kumi: bucket %d: the window names position %d, not held", r.bucket, pos))
	}
	return i
}

// pump takes the pending events the window has room for, within the
// resize bound (the window sends what it may), then has the read side
// poll and checks the drains.
func (r *reader) pump(ctx actor.Context) {
	if r.stopped {
		return
	}
	r.limitRuns()
	r.take(ctx)
	r.feedDo(ctx, r.feed.Poll(r.feedEnv())) // the hold for what is pending now, and the catch-up's next page
	r.maybeFinishDrain(ctx)
	r.maybeDrainToCut(ctx)
}

// take gives the window the pending events it has room for, again while
// it finishes what it takes at once (the events of parked streams).
func (r *reader) take(ctx actor.Context) {
	for more := true; more && !r.stopped; {
		more = r.takeOnce(ctx)
	}
}

// takeOnce gives the window the pending events it has room for, and
// reports whether it took some and finished them at once, its room back.
func (r *reader) takeOnce(ctx actor.Context) bool {
	room := r.ws.st.Room()
	if room == 0 {
		return false
	}
	pending := r.feed.Pending()
	n := 0
	for n < len(pending) && n < room && !r.beyondBound(pending[n].Position) {
		n++
	}
	if n == 0 {
		return false
	}
	evs := r.ws.scratch[:0]
	for _, e := range pending[:n] {
		we := window.Event{Pos: e.Position, Stream: e.Stream, Err: e.Err, Size: eventSize(e), Parked: r.isParked(e.Stream)}
		if c := r.carried; c != nil && e.Position >= c.pos {
			if e.Position == c.pos {
				we.Attempt, we.Free = c.attempt, c.free // a retry its predecessor left (see leftRetry)
				if c.letter != nil {
					we.Letter = &window.Letter{Reason: c.letter.Reason, Attempts: c.letter.Attempts}
				}
			}
			r.carried = nil
		}
		evs = append(evs, we)
	}
	took, e := r.ws.st.Take(evs)
	clear(evs)
	r.ws.scratch = evs[:0]
	r.ws.hold(r.feed.Take(took))
	r.wdo(ctx, e)
	return took > 0 && e.Finished.Events > 0 && r.ws.st.Room() > 0 && len(r.feed.Pending()) > 0
}

// hold appends evs to the held events. The finished prefix is cut off
// held's front, not moved over at each event: once held reaches the end
// of its array, what it holds moves to the array's start, and only if it
// does not fit there does append grow it.
func (w *windowed) hold(evs []eventsource.RecordedEvent) {
	if l := len(w.held); l+len(evs) > cap(w.held) && l+len(evs) <= cap(w.hbuf) {
		off := cap(w.hbuf) - cap(w.held) // held is w.hbuf[off : off+l]
		copy(w.hbuf[:l], w.held)
		clear(w.hbuf[max(l, off) : off+l]) // hold no event twice
		w.held = w.hbuf[:l]
	}
	w.held = append(w.held, evs...)
	if cap(w.held) > cap(w.hbuf) {
		w.hbuf = w.held[:0] // grown: a new array
	}
}

// wdo carries out the window's effects, in order: the finished prefix to
// the checkpoint side, then the rest; a lease check is answered at once
// (EnsureHeld), and what its answer gives carried out in turn.
func (r *reader) wdo(ctx actor.Context, e window.Effects) {
	if f := e.Finished; f.Events > 0 {
		// A batch's slot counts its events: held drops as many.
		clear(r.ws.held[:f.Events])
		r.ws.held = r.ws.held[f.Events:]
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
		r.ws.hold(r.feed.Take(e.Absorbed))
	}
	var late *wsent
	for _, g := range e.GivenUp {
		if ws := r.wgiveUp(g, &e); late == nil && g.Late {
			late = ws
		}
	}
	if er := e.EndRun; er != nil {
		r.endRun(ctx, er)
	}
	if e.CutRun {
		for _, ws := range r.ws.out {
			if ws.run != nil {
				ws.run.cutShort() // it answers after the event in hand
			}
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
// most, or a run (nil when neither is sent: the window does not look).
func (r *reader) wpending() []window.Event {
	most := r.g.opts.Batch.MaxEvents - 1
	if r.ws.st.Runs() {
		most = r.runEvents() - 1
	}
	if most <= 0 {
		return nil
	}
	pending := r.feed.Pending()
	evs := r.ws.scratch[:0]
	for _, e := range pending[:min(most, len(pending))] {
		if r.beyondBound(e.Position) {
			break
		}
		evs = append(evs, window.Event{Pos: e.Position, Stream: e.Stream, Err: e.Err, Size: eventSize(e),
			Parked: r.isParked(e.Stream)})
	}
	r.ws.scratch = evs
	return evs
}

// wstep carries out an input's effects, then takes what the window has
// room for and checks the drains (see pump).
func (r *reader) wstep(ctx actor.Context, e window.Effects) {
	r.wdo(ctx, e)
	r.pump(ctx)
}

// wsend delivers an event to the handler, as the window says.
func (r *reader) wsend(ctx actor.Context, s window.Send) {
	ws := &wsent{wid: s.ID, sentAt: time.Now()}
	ws.d = Delivery{Event: r.wevent(s.Pos), Attempt: s.Attempt, Subscription: r.g.opts.Subscription, Generation: r.generation,
		Bucket: r.genBucket, Epoch: r.epoch, Fence: r.fence, id: answerIDs.Add(1), exclusive: r.g.opts.MaxInFlight == 1,
		replyTo: ctx.Self()}
	if s.Run != 0 {
		// A run: its handler makes each event's context and span.
		i := r.wheldAt(s.Pos)
		ws.batch, ws.runNo = append(make([]eventsource.RecordedEvent, 0, len(s.Events)), r.ws.held[i:i+len(s.Events)]...), s.Run
		ws.run = &run{d: &ws.d, events: ws.batch, held: r.g.leases.EnsureHeld, slot: r.bucket, tel: r.g.telemetry,
			until: ws.sentAt.Add(r.tick), limit: r.runLimit()}
		r.ws.out[ws.d.id] = ws
		ctx.Send(r.handler, ws.run)
		return
	}
	// Not a child of r.bg: the reader cancels every delivery context
	// itself (see wcancel), and a context not derived from a cancellable
	// one costs no registration with it per delivery.
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
func (r *reader) wletter(ctx actor.Context, l window.Letter) {
	dl, id := r.wletterOf(l.Pos, l.Reason, l.Attempts), l.ID
	if r.parked != nil {
		r.park(ctx, dl, id)
		return
	}
	r.async(ctx, func(c context.Context) any {
		_, err := r.g.store.AddDeadLetter(c, dl)
		return &deadLettered{inc: r, id: id, err: err}
	})
}

// wgiveUp ends a delivery the window no longer waits for: late (a failed
// attempt; e says whether it spent the event's budget), or sent again to
// a replaced handler's successor.
func (r *reader) wgiveUp(g window.GivenUp, e *window.Effects) *wsent {
	var ws *wsent
	for _, o := range r.ws.out {
		if o.wid == g.ID && o.d.Attempt == g.Attempt {
			ws = o
			break
		}
	}
	if ws == nil || ws.run != nil {
		return ws // a run: ended by EndRun
	}
	delete(r.ws.out, ws.d.id)
	ws.release()
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
func letterAt(e *window.Effects, pos int64) (window.Letter, bool) {
	for _, l := range e.Letters {
		if l.Pos == pos {
			return l, true
		}
	}
	return window.Letter{}, false
}

// wanswer gives the window a handler's answer.
func (r *reader) wanswer(ctx actor.Context, m *handlerReply) {
	ws := r.ws.out[m.id]
	if ws == nil || m.attempt != ws.d.Attempt || r.stopped {
		return // an answer to an attempt given up on (timeout), or to a stopped reader
	}
	delete(r.ws.out, m.id)
	if ws.run != nil {
		r.runAnswered(ctx, ws)
		return
	}
	ws.release()
	var wa window.Answer
	var a replyMeaning
	head := ws.d.Event.Position // the event the answer's outcome is of
	if ws.batch != nil {
		wa, a, head = r.wbatchAnswer(ws, m.msg)
	} else {
		a = classifyAnswer(m.msg, nil, r.g.opts.HandlerTimeout)
		wa = window.Answer{Outcome: outcomeOf(a), After: a.after, Reason: a.reason, Committed: a.committed}
	}
	if a.warn != "" {
		r.warnAnswer(a.warn, &ws.d, m.msg)
	}
	wa.ID, wa.Attempt, wa.Runs = ws.wid, ws.d.Attempt, m.runs
	e := r.ws.st.Answered(time.Now(), wa)
	o := outcomeOf(a)
	switch l, dead := letterAt(&e, head); {
	case o == window.Acked:
		ws.span.End(observability.OutcomeAck, nil)
	case dead:
		ws.span.End(observability.OutcomeDeadLetter, errors.New(l.Reason))
	case o == window.Panicked:
		ws.span.EndPanic(a.reason, nil)
	default:
		ws.span.End(a.outcome, errors.New(a.reason))
	}
	r.wstep(ctx, e)
}

// wreplace gives up on the handler, as the window says (its probe
// unanswered, or its stop), and spawns its successor after the group's
// retry backoff for the replacements in a row.
func (r *reader) wreplace(ctx actor.Context, rp *window.ReplaceHandler) {
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
	if r.ws.st == nil || r.ws.st.Len() == 0 {
		return r.carried
	}
	l, ok := r.ws.st.Left()
	if ws := r.runInFlight(); ws != nil {
		l, ok, _ = r.ws.st.LeftRun(r.runOutcome(ws, ws.run.end()))
	}
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
		ws.release()
		if ws.run != nil {
			ws.span = ws.run.end().span // the event in hand, or the one not acked
		}
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
		if errors.Is(m.err, eventsource.ErrFenceLost) {
			r.lostFence(ctx, m.err) // parking is fenced: the bucket is another's
			return
		}
		err := fmt.Errorf("kumi: bucket %d: dead-letter: %w", r.bucket, m.err)
		r.wdo(ctx, r.ws.st.LetterFailed(m.id))
		if r.retryInPlace(ctx, err, &rewriteDeadLetter{inc: r, id: m.id}) {
			return
		}
		panic(err)
	}
	r.storeFailures = 0
	if m.parked != nil {
		r.wstep(ctx, r.parkedStream(m))
		return
	}
	r.wstep(ctx, r.ws.st.LetterWritten(m.id))
}

// inFlight is how many slots the reader's window holds.
func (r *reader) inFlight() int {
	if r.ws.st == nil {
		return 0
	}
	return r.ws.st.Len()
}

// outcomeOf is the window's outcome of a single delivery's answer.
func outcomeOf(a replyMeaning) window.Outcome {
	switch a.outcome {
	case observability.OutcomeAck:
		return window.Acked
	case observability.OutcomeDeadLetter:
		return window.DeadLettered
	case observability.OutcomePanic:
		return window.Panicked
	}
	return window.Retry
}

// wbatchAnswer reads a batch's answer for the window (see
// classifyBatchAnswer): all done; a prefix done and the answer for the
// first not done; or a failure as a whole. a is the meaning of the answer
// for the event at head — the first not done — for its span and logs.
func (r *reader) wbatchAnswer(ws *wsent, res any) (wa window.Answer, a replyMeaning, head int64) {
	n := len(ws.batch)
	m := classifyBatchAnswer(res, n)
	switch {
	case m.all:
		return window.Answer{Outcome: window.BatchAcked, Done: n, Committed: m.committed},
			replyMeaning{outcome: observability.OutcomeAck, warn: m.warn}, ws.batch[n-1].Position
	case m.alone:
		a = classifyAnswer(m.next, nil, r.g.opts.HandlerTimeout)
		if a.outcome != observability.OutcomePanic {
			a.outcome = observability.OutcomeRetry // a whole failure is a retry
		}
		wa = window.Answer{Outcome: outcomeOf(a), After: a.after, Reason: a.reason}
		head = ws.batch[0].Position
	default:
		a = classifyAnswer(m.next, nil, r.g.opts.HandlerTimeout)
		wa = window.Answer{Outcome: window.BatchAcked, Done: m.done, Committed: m.committed, Next: outcomeOf(a),
			After: a.after, Reason: a.reason, NextCommitted: a.committed}
		head = ws.batch[m.done].Position
	}
	if m.warn != "" {
		a.warn = m.warn
	}
	return wa, a, head
}

// redeliver sends a retried event again once its delay has passed (the
// window checks the lease first).
func (r *reader) redeliver(ctx actor.Context, m *redeliver) {
	if !r.stopped {
		r.wstep(ctx, r.ws.st.Redeliver(time.Now(), m.id, m.attempt))
	}
}

// onHandlerReply gives the window a handler's answer.
func (r *reader) onHandlerReply(ctx actor.Context, m *handlerReply) {
	if !r.onReleaseAnswer(ctx, m) {
		r.wanswer(ctx, m)
	}
}

var errHandlerTimeout = errors.New("kumi: the handler did not answer in time")

// msgHandlerHung is the Warn log of a handler replaced for not answering.
const msgHandlerHung = "kumi: handler hung; replacing it"

// handlerReady reports whether deliveries may be sent to the handler: it
// exists, and no probe of it is out.
func (r *reader) handlerReady() bool { return r.handler != nil && r.probe == 0 }

// checkTimeouts acts on deliveries unanswered for HandlerTimeout. Each
// counts as a retry. And the handler is probed: a probe is answered by
// kumi's middleware on the handler's own goroutine, so a handler that is
// merely slow with one event, or lost a delivery, answers it at once,
// while one stuck in a call (or suspended) does not. Nothing is sent to
// the handler until it answers; if it does not within probeWait, it is
// taken for hung and replaced. So a retry never queues behind a stuck
// call.
func (r *reader) checkTimeouts(ctx actor.Context) {
	if !r.stopped {
		r.runProgress()
		r.wstep(ctx, r.ws.st.Tick(time.Now()))
	}
}

// lateDelivery describes the delivery that got its handler probed.
type lateDelivery struct {
	id, stream string
	position   int64
	attempt    int
	sentAt     time.Time
}

// probeWait is how long a probed handler has to answer.
func (r *reader) probeWait() time.Duration {
	return min(max(r.g.opts.HandlerTimeout/2, time.Millisecond), 5*time.Second)
}

// onProbeAnswer: the handler is alive; what waited for it is sent.
func (r *reader) onProbeAnswer(ctx actor.Context, seq uint64) {
	if seq != r.probe || r.stopped {
		return
	}
	r.probe = 0
	r.wstep(ctx, r.ws.st.ProbeAnswered(r.ws.probe))
}

// errHandlerHung and errHandlerStopped are why a reader replaces its
// handler, as reported to the supervision observer.
var (
	errHandlerHung    = errors.New("kumi: handler hung")
	errHandlerStopped = errors.New("kumi: handler stopped")
)

// onHandlerTerminated replaces a handler that stopped: by itself, or by its
// supervisor once its restart budget was spent.
func (r *reader) onHandlerTerminated(ctx actor.Context, who *actor.PID) {
	if r.stopped || !who.Equal(r.handler) {
		return // a handler replaced earlier
	}
	r.g.logger.Warn("kumi: handler stopped; replacing it", "bucket", r.bucket, "handler", who.String())
	r.runProgress()
	r.wstep(ctx, r.ws.st.HandlerStopped(time.Now(), r.ws.hno)) // replaced (see wreplace)
}

// spawnHandler starts a handler for the reader and watches it.
func (r *reader) spawnHandler(ctx actor.Context) {
	props := handlerProps(r.g.opts.Handler, r.g.handlerSupervisor, r.g.rt.dispatcher)
	r.handler = ctx.ActorSystem().Root.SpawnPrefix(props, fmt.Sprintf("kumi-handler-%s-%d-", r.g.opts.Subscription, r.bucket))
	r.ws.hno++ // the window numbers its handlers so (see window.State.HandlerSpawned)
	ctx.Watch(r.handler)
	if r.replacements > 0 && r.overflowed == nil {
		r.g.setReaderState(r.bucket, "")
	}
}

// The Warn logs of a handler that breaks the contract, once per bucket
// and kind (see warnAnswer). They say what to do.
const (
	msgWrongAnswer = "kumi: a handler answered a delivery with something that is not an answer; the event is retried, " +
		"then dead-lettered. Answer each *actors.Delivery with ctx.Respond(actors.Ack{}), actors.Retry{...} or " +
		"actors.DeadLetter{...}, and each *actors.Batch with actors.BatchAck{...} — or write the handler with " +
		"actors.Func or actors.BatchFunc, which answer for you (logged once per bucket)"
	msgNoAnswer = "kumi: a handler did not answer a delivery within HandlerTimeout; the event is retried, then " +
		"dead-lettered. Answer each *actors.Delivery with ctx.Respond (or d.Respond once the work is done), and raise " +
		"GroupOptions.HandlerTimeout if handling an event takes longer (logged once per bucket)"
)

// answerWarning is a Warn log already given: to a bucket, for a kind of
// answer.
type answerWarning struct {
	bucket int
	msg    string
}

// warnAnswer logs msg for the answer to d, unless the group logged it for
// the bucket already: a handler that never answers, or answers with the
// wrong type, fails every event the same way, and one line per bucket
// says it.
func (r *reader) warnAnswer(msg string, d *Delivery, answer any) {
	if _, done := r.g.answerWarned.LoadOrStore(answerWarning{r.bucket, msg}, struct{}{}); done {
		return
	}
	r.g.logger.Warn(msg, "bucket", r.bucket, "answer", fmt.Sprintf("%T", answer), "event_id", d.Event.ID.String(),
		"stream", d.Event.Stream, "position", d.Event.Position, "handler_timeout", r.g.opts.HandlerTimeout)
}

// onDeadLettered takes a dead letter's write (see wdeadLettered).
func (r *reader) onDeadLettered(ctx actor.Context, m *deadLettered) { r.wdeadLettered(ctx, m) }

// retryInPlace decides about a failed database call of the reader. A
// transient failure (a dropped connection, a timeout, a serialization
// failure) is retried where it happened — again posts retry after the
// group's retry backoff, or, when again is nil, the next timer tick
// retries — rather than restarting the reader, which would forget what it
// acked since its last checkpoint and deliver it again. It reports false
// for any other failure, which the caller panics with: supervision then
// restarts, stops or escalates (a missing table, a missing grant). While
// failures go on, the reader keeps checking its lease: once unsure, it
// drains and stops as after a failed renewal.
func (r *reader) retryInPlace(ctx actor.Context, err error, again any) bool {
	if supervision.Classify(err) != supervision.Transient {
		return false
	}
	r.storeFailures++
	if r.storeFailures == 1 {
		r.g.logger.Warn("kumi: a reader's database call failed; retrying it in place", "bucket", r.bucket, "err", err)
	}
	if herr := r.g.leases.EnsureHeld(r.bucket); herr != nil {
		r.unsureLease(ctx, herr)
	}
	if again != nil && !r.stopped {
		r.after(ctx, r.g.opts.Retry.Backoff.Next(r.storeFailures), again)
	}
	return true
}

// acked is the position through which the reader's events were handled
// (see checkpointing.State.Acked); 0 before it started.
func (r *reader) acked() int64 {
	if r.cp == nil {
		return 0
	}
	return r.cp.Acked()
}

// cpDo carries out the checkpoint side's effects: a fenced write.
func (r *reader) cpDo(ctx actor.Context, e checkpointing.Effects) {
	if e.Write != nil {
		r.writeCheckpoint(ctx, *e.Write)
	}
}

// writeCheckpoint writes the checkpoint the checkpoint side asked for,
// fenced, and answers it by its id.
func (r *reader) writeCheckpoint(ctx actor.Context, w checkpointing.Write) {
	pos, o := w.Pos, r.g.opts
	r.async(ctx, func(c context.Context) any {
		_, err := r.g.store.SaveCheckpoint(c, o.Subscription, r.bucket, pos, r.fence)
		if errors.Is(err, eventsource.ErrCheckpointAboveHead) {
			// Refused above the head on the same server: the head went
			// back (a restore). Looked at again, with the position seen,
			// the store counts it as a change, and the reader's next
			// incarnation starts in the new epoch.
			r.g.store.SawPosition(pos)
			_, _ = r.g.store.CheckServer(c)
		}
		return &flushDone{inc: r, write: w.ID, err: err}
	})
}

// onFlushed takes a checkpoint write's answer to the checkpoint side, and
// does what it says of a failure (see checkpointing.State.Failed).
func (r *reader) onFlushed(ctx actor.Context, f *flushDone) {
	if f.err == nil {
		r.storeFailures = 0
		if e := r.cp.Written(f.write); e.Progress {
			ctx.Send(ctx.Parent(), &readerProgress{Bucket: r.bucket, Position: r.cp.Flushed()})
		}
		r.maybeFinishDrain(ctx)
		return
	}
	err := fmt.Errorf("kumi: bucket %d: checkpoint: %w", r.bucket, f.err)
	switch r.cp.Failed(f.write, writeFailure(err), checkpointing.Env{Unsure: r.unsure != nil}) {
	case checkpointing.StopLost:
		// The bucket is gone: stop, and leave the rest to its owner.
		r.lostFence(ctx, f.err)
	case checkpointing.EndUnwritten:
		// Under an unsure lease: the events in flight finish first (see
		// maybeFinishDrain).
		r.maybeFinishDrain(ctx)
	case checkpointing.NewEpoch:
		// Positions of another server: retried, the write could land once
		// the new server's head passes it, and skip what it handed out
		// again (see newEpoch). (Under an unsure lease the reader stops
		// instead, and the next one starts in the new epoch.)
		r.newEpoch(f.err)
	case checkpointing.RetryOnTick:
		r.retryInPlace(ctx, err, nil) // the next tick writes again
	case checkpointing.Fail:
		panic(err)
	}
}

// writeFailure classifies a failed checkpoint write for the checkpoint
// side.
func writeFailure(err error) checkpointing.Failure {
	switch {
	case errors.Is(err, eventsource.ErrFenceLost):
		return checkpointing.FenceLost
	case errors.Is(err, eventsource.ErrServerChanged) || errors.Is(err, eventsource.ErrCheckpointAboveHead):
		return checkpointing.ServerChanged
	case supervision.Classify(err) == supervision.Transient:
		return checkpointing.Transient
	}
	return checkpointing.Permanent
}

// maybeFinishDrain ends a drain once the window says so — nothing with
// the handler or being dead-lettered, nothing more to send — and the
// checkpoint is flushed, or, under an unsure lease, its write failed. The
// events the window does not send are left to the next owner: the
// checkpoint stays before them.
func (r *reader) maybeFinishDrain(ctx actor.Context) {
	if !r.draining || r.stopped || !r.ws.drained {
		return
	}
	r.endDrain(ctx)
}

// endDrain writes the drain's last checkpoint, and, once it is written
// (or, under an unsure lease, failed), stops the reader.
func (r *reader) endDrain(ctx actor.Context) {
	e, done := r.cp.Drain(checkpointing.Env{Unsure: r.unsure != nil})
	if r.cpDo(ctx, e); !done {
		return // the last write is out
	}
	if r.overflowed != nil {
		r.endOverflowed(r.overflowed)
	}
	if r.unsure != nil {
		ctx.Send(ctx.Parent(), &readerProgress{Bucket: r.bucket, Position: r.cp.Flushed()})
		r.tellLost(ctx, r.unsure)
	} else {
		ctx.Send(ctx.Parent(), &readerDrained{Bucket: r.bucket, Position: r.cp.Flushed()})
	}
	r.shutdown(ctx)
	ctx.Stop(ctx.Self())
}

// beginDrain starts a drain (a handoff, a graceful stop, an overflow):
// the window takes nothing new, sends what keeps the checkpoint before
// events already sent (see window.State.Drain), and has a handler being
// replaced spawned at once when it has something to send.
func (r *reader) beginDrain(ctx actor.Context) {
	r.draining = true
	if !r.stopped {
		r.wstep(ctx, r.ws.st.Drain())
	}
}

// unsureLease stops the reader once it can no longer be sure it holds its
// bucket (EnsureHeld failed), but not at once: it delivers nothing more,
// lets the events with the handler finish (HandlerTimeout bounds them),
// and writes its acked position — fenced, so harmless if the bucket is in
// fact lost — before it stops. If the lease was held all along (a renewal
// that ran late), the reader the coordinator spawns next, at the same
// epoch, starts after everything acked here and delivers nothing twice:
// after the checkpoint written, or, if that last write failed, after the
// acked position this reader leaves its coordinator (see resumeAt).
func (r *reader) unsureLease(ctx actor.Context, err error) {
	if r.stopped || r.unsure != nil {
		return
	}
	r.markUnsure(err)
	r.wstep(ctx, r.ws.st.Unsure())
}

// lostFence stops the reader at once: another worker holds the bucket (a
// fenced write was refused).
func (r *reader) lostFence(ctx actor.Context, err error) {
	if r.stopped {
		return
	}
	if r.unsure == nil {
		r.g.telemetry.fenceLost(r.bucket, r.epoch, err)
	}
	r.tellLost(ctx, err)
	r.shutdown(ctx)
	ctx.Stop(ctx.Self())
}

// tellLost tells the coordinator that the reader stops on a lost or
// unsure lease. The coordinator acts on the reader's Terminated only after
// this message (see readerGone), so it spawns no reader for the slot
// before a pass confirms the lease.
func (r *reader) tellLost(ctx actor.Context, err error) {
	ctx.Send(ctx.Parent(), &readerLostFence{Bucket: r.bucket, Epoch: r.epoch, Err: err})
}

// eventSize is what an event counts against Batch.MaxBytes.
func eventSize(e eventsource.RecordedEvent) int { return len(e.Data) + len(e.Metadata) }
