package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/checkpointing"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// The delivery window. A reader takes events from its pending list, in
// position order, into a window of at most MaxInFlight entries, and sends a
// entry to the handler when no earlier event of the same stream is still
// unfinished: per-stream order holds, and events of other streams need not
// wait. The checkpoint moves over the finished prefix of the window only,
// so it never passes an unfinished event. With MaxInFlight 1 (the default)
// the reader delivers strictly one event at a time.

type entryState uint8

const (
	entryWaiting       entryState = iota // its stream has an earlier event unfinished
	entrySent                            // the handler has it; no answer yet
	entryRetrying                        // a redelivery is scheduled
	entryDeadLettering                   // its dead letter is being written
	entryDone
)

type entry struct {
	// d is the delivery of the current attempt. It is handed to the
	// handler as is; a retry makes a new one, so a handler that keeps a
	// *Delivery never sees it change.
	d      *Delivery
	state  entryState
	sentAt time.Time
	span   observability.DeliverySpan
	to     *actor.PID         // the handler the current attempt went to
	cancel context.CancelFunc // cancels d.Context
	// free counts attempts not charged to the event's retry budget: sent
	// again because the handler that had it was replaced for another
	// event's fault.
	free int
	dl   *eventsource.DeadLetter // the row being written (entryDeadLettering)
	// batch holds the events of the batch sent (Batch.MaxEvents set);
	// batch[0] is d.Event. See batchdeliver.go.
	batch []eventsource.RecordedEvent
	alone bool // the batch failed as a whole: its first event goes alone next
	// run is the run sent to a function handler (see funcrun.go); its
	// events are batch.
	run *run
	// drainSent: a drain sent it once more, at once (see sendOnDrain).
	drainSent bool
	// due: a retry whose delay passed while the handler was not ready,
	// waiting for it; a drain sends it as the retry it is (see
	// drainSends).
	due bool
}

// last is the position of the entry's last event.
func (s *entry) last() int64 {
	if n := len(s.batch); n > 0 {
		return s.batch[n-1].Position
	}
	return s.d.Event.Position
}

// count is the number of the entry's events.
func (s *entry) count() int { return max(len(s.batch), 1) }

// release cancels the current attempt's context.
func (s *entry) release() {
	if s.cancel != nil {
		s.cancel()
		s.cancel = nil
	}
}

// newEntry is an entry and its first delivery, allocated together.
type newEntry struct {
	s entry
	d Delivery
}

type window struct {
	entries []*entry          // in position order
	byID    map[uint64]*entry // entries sent at least once
	busy    map[string]bool   // streams with an entry sent, retrying or dead-lettering
	runs    bool              // the handler takes runs (see funcrun.go)
}

// dropFinished removes the first n entries, keeping the array: the window
// appends to it again (one allocation per event saved when events come one
// at a time).
func (w *window) dropFinished(n int) {
	if n == 0 {
		return
	}
	k := copy(w.entries, w.entries[n:])
	clear(w.entries[k:]) // hold no finished delivery
	w.entries = w.entries[:k]
}

// active counts the entries the handler or the store is working on.
func (w *window) active() int {
	n := 0
	for _, s := range w.entries {
		if s.state == entrySent || s.state == entryDeadLettering {
			n++
		}
	}
	return n
}

// cancel ends the spans of unanswered deliveries when the reader stops.
func (w *window) cancel() {
	for _, s := range w.entries {
		if s.state == entrySent {
			s.state = entryWaiting
			s.release()
			if s.run != nil {
				s.span = s.run.end().span // the event in hand, or the one not acked
				s.run = nil
			}
			s.span.End(observability.OutcomeCancelled, nil)
		}
	}
}

// pump fills the window from the pending events and sends every entry whose
// stream is free.
func (r *reader) pump(ctx actor.Context) {
	if r.win.byID == nil {
		r.win.byID, r.win.busy = map[uint64]*entry{}, map[string]bool{}
	}
	if r.stopped {
		return
	}
	r.limitRuns()
	if r.wired() {
		r.wpump(ctx)
	} else if !r.draining {
		for len(r.win.entries) < r.g.opts.MaxInFlight && len(r.feed.Pending()) > 0 && !r.beyondBound(r.feed.Pending()[0].Position) {
			e := r.feed.Take(1)[0]
			n := &newEntry{d: Delivery{
				Event: e, Subscription: r.g.opts.Subscription, Generation: r.generation, Bucket: r.genBucket, Epoch: r.epoch,
				Fence: r.fence, id: answerIDs.Add(1), exclusive: r.g.opts.MaxInFlight == 1, replyTo: ctx.Self(),
			}}
			n.s.d = &n.d
			if c := r.carried; c != nil && e.Position >= c.pos {
				if e.Position == c.pos {
					n.d.Attempt, n.s.free = c.attempt, c.free // a retry its predecessor left (see leftRetry)
					if c.letter != nil {
						dl := *c.letter // a dead letter it was writing: written again, not sent (see sendFirst)
						n.s.dl = &dl
					}
				}
				r.carried = nil
			}
			r.win.entries = append(r.win.entries, &n.s)
		}
		for _, s := range r.win.entries {
			if s.state != entryWaiting || r.win.busy[s.d.Event.Stream] || !r.handlerReady() {
				continue // the handler is probed or replaced: sent once it answers, or to its successor
			}
			if err := r.g.leases.EnsureHeld(r.bucket); err != nil {
				r.unsureLease(ctx, err) // every delivery needs a lease it can trust
				return
			}
			r.sendFirst(ctx, s)
		}
	}
	r.feedDo(ctx, r.feed.Poll(r.feedEnv())) // the hold for what is pending now, and the catch-up's next page
	r.maybeFinishDrain(ctx)
	r.maybeDrainToCut(ctx)
}

// sendFirst delivers a waiting entry whose stream is free.
func (r *reader) sendFirst(ctx actor.Context, s *entry) {
	r.win.busy[s.d.Event.Stream] = true
	r.win.byID[s.d.id] = s
	if s.dl != nil {
		// Its predecessor at this epoch stopped while writing its dead
		// letter: the letter is written again (an upsert on the event),
		// and the event is not delivered again.
		s.state = entryDeadLettering
		r.writeDeadLetter(ctx, s)
		return
	}
	if err := s.d.Event.Err; err != nil {
		// The store holds the event but cannot give it back: no handler
		// can take it, so it costs its bucket a dead letter.
		r.deadLetter(ctx, s, err.Error(), 0)
		return
	}
	r.send(ctx, s)
}

// send delivers an entry's event (again) to the handler.
func (r *reader) send(ctx actor.Context, s *entry) {
	if r.takesRuns() {
		r.sendRun(ctx, s)
		return
	}
	var c context.Context
	// Not a child of r.bg: the reader cancels every delivery context
	// itself, after the answer, on a timeout, and when it stops (see
	// window.cancel), and a context not derived from a cancellable one
	// costs no registration with it per delivery.
	c, s.span = r.g.telemetry.startDelivery(context.Background(), s.d)
	s.d.Context, s.cancel = context.WithCancel(c)
	s.state, s.sentAt, s.to, s.due = entrySent, time.Now(), r.handler, false
	ctx.Request(r.handler, s.d)
}

// redeliver sends a retried entry again once its delay has passed.
func (r *reader) redeliver(ctx actor.Context, m *redeliver) {
	if r.wired() {
		if !r.stopped {
			r.wstep(ctx, r.ws.st.Redeliver(time.Now(), m.id, m.attempt))
		}
		return
	}
	s := r.win.byID[m.id]
	if s == nil || s.state != entryRetrying || r.stopped {
		return
	}
	if r.draining {
		return // a drain sends it at once, or leaves it (see sendOnDrain)
	}
	if !r.handlerReady() {
		// The handler is probed or replaced: the retry is sent once it
		// answers the probe, or to its successor.
		s.state, s.due = entryWaiting, true
		delete(r.win.busy, s.d.Event.Stream)
		return
	}
	if err := r.g.leases.EnsureHeld(r.bucket); err != nil {
		r.unsureLease(ctx, err) // a retry, too, needs a lease it can trust
		return
	}
	r.send(ctx, s)
}

// onHandlerReply matches a handler's answer to its entry.
func (r *reader) onHandlerReply(ctx actor.Context, m *handlerReply) {
	if r.wired() {
		r.wanswer(ctx, m)
		return
	}
	s := r.win.byID[m.id]
	if s == nil || s.state != entrySent || m.attempt != s.d.Attempt || r.stopped {
		return // an answer to an attempt given up on (timeout), or to a stopped reader
	}
	if ru, isRun := m.msg.(*run); isRun && ru != s.run {
		return // a run the reader ended
	}
	if _, panicked := m.msg.(*handlerPanicked); !panicked && s.to.Equal(r.handler) {
		r.handlerFails = 0 // the handler answers: replacements start over from the shortest backoff
		r.win.runs = r.win.runs || m.runs
	}
	r.onReply(ctx, s, m.msg, nil)
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
	now := time.Now()
	if r.wired() {
		if !r.stopped {
			r.wstep(ctx, r.ws.st.Tick(now))
		}
		return
	}
	if r.probe != 0 && now.Sub(r.probeAt) >= r.probeWait() {
		late := r.probeFor
		waited := now.Sub(late.sentAt)
		r.g.logger.Warn(msgHandlerHung, "bucket", r.bucket, "event_id", late.id,
			"stream", late.stream, "position", late.position, "attempt", late.attempt,
			"unanswered_for", waited, "handler_timeout", r.g.opts.HandlerTimeout, "handler", r.handler.String())
		r.replaceHandler(ctx, fmt.Errorf("%w: event %s (stream %s, position %d) unanswered for %v",
			errHandlerHung, late.id, late.stream, late.position, waited.Round(time.Millisecond)))
	}
	for _, s := range r.win.entries {
		if s.state != entrySent || (s.run == nil && now.Sub(s.sentAt) < r.g.opts.HandlerTimeout) {
			continue
		}
		if s.run != nil && !r.timeoutRun(ctx, s, now) {
			continue // its event in hand is not late
		}
		if r.probe == 0 && s.to.Equal(r.handler) {
			r.probe, r.probeAt = answerIDs.Add(1), now
			r.probeFor = lateDelivery{id: s.d.Event.ID.String(), stream: s.d.Event.Stream,
				position: s.d.Event.Position, attempt: s.d.Attempt, sentAt: s.sentAt}
			ctx.Send(r.handler, &handlerProbe{seq: r.probe, replyTo: ctx.Self()})
		}
		r.onReply(ctx, s, nil, errHandlerTimeout)
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
	if r.wired() {
		r.wdo(ctx, r.ws.st.ProbeAnswered(r.ws.probe))
	}
	r.pump(ctx)
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
	if r.wired() {
		r.wstep(ctx, r.ws.st.HandlerStopped(time.Now(), r.ws.hno))
		return
	}
	r.replaceHandler(ctx, errHandlerStopped)
}

// replaceHandler gives up on the current handler and spawns its successor
// after the group's retry backoff (growing while handlers keep failing,
// from the start again once one answers). Deliveries it has not answered
// and that are not yet late go to the successor without being charged to
// their events' retry budgets: the fault was another event's. The old
// handler is stopped; if it is stuck in a call, the stop takes effect when
// the call returns, and nothing is sent to it meanwhile.
func (r *reader) replaceHandler(ctx actor.Context, why error) {
	old := r.handler
	if old == nil {
		return
	}
	r.handler, r.probe = nil, 0
	r.handlerFails++
	r.replacements++
	r.g.setReaderState(r.bucket, readerReplacingHandler)
	ctx.Unwatch(old)
	ctx.Stop(old)
	now := time.Now()
	for _, s := range r.win.entries {
		if s.state != entrySent || !s.to.Equal(old) {
			continue // answered
		}
		if s.run != nil {
			if since, inHand := s.run.lateSince(); inHand && now.Sub(since) >= r.g.opts.HandlerTimeout {
				continue // late: the caller charges it
			}
			o, finished := r.endRun(ctx, s)
			switch {
			case finished:
				continue
			case !o.inHand && o.next == nil:
				r.unsend(s) // its event was not started
				continue
			}
			s.span = o.span
		} else if now.Sub(s.sentAt) >= r.g.opts.HandlerTimeout {
			continue // late: the caller charges it
		}
		s.release()
		s.span.End(observability.OutcomeCancelled, nil)
		r.unbatch(s)
		next := *s.d
		next.Attempt++
		s.d, s.free = &next, s.free+1
		s.state = entryWaiting
		delete(r.win.busy, s.d.Event.Stream)
	}
	delay := r.g.opts.Retry.Backoff.Next(r.handlerFails)
	r.g.observer("handler").Observe(supervision.Decision{
		Strategy: "reader", Supervisor: ctx.Self().String(), Child: old.String(), Class: supervision.Unknown,
		Directive: actor.RestartDirective, Reason: why, Time: now, Attempt: r.handlerFails, Delay: delay,
		Targets: []string{old.String()},
	})
	r.after(ctx, delay, &respawnHandler{inc: r})
}

// spawnHandler starts a handler for the reader and watches it.
func (r *reader) spawnHandler(ctx actor.Context) {
	props := handlerProps(r.g.opts.Handler, r.g.handlerSupervisor, r.g.rt.dispatcher)
	r.win.runs = false // until it says it takes them
	r.handler = ctx.ActorSystem().Root.SpawnPrefix(props, fmt.Sprintf("kumi-handler-%s-%d-", r.g.opts.Subscription, r.bucket))
	r.ws.hno++ // the window numbers its handlers so (see windowed.go)
	ctx.Watch(r.handler)
	if r.replacements > 0 && r.overflowed == nil {
		r.g.setReaderState(r.bucket, "")
	}
}

// onReply acts on the handler's answer (or its absence) for an entry.
func (r *reader) onReply(ctx actor.Context, s *entry, res any, err error) {
	s.release()
	if s.run != nil {
		var settled bool
		if res, settled = r.onRunAnswer(ctx, s); settled {
			return
		}
	}
	span := s.span
	a := classifyAnswer(res, err, r.g.opts.HandlerTimeout)
	switch {
	case a.outcome == observability.OutcomeAck:
		span.End(observability.OutcomeAck, nil)
		r.finish(ctx, s, a.committed)
		return
	case a.outcome == observability.OutcomeDeadLetter:
		span.End(observability.OutcomeDeadLetter, errors.New(a.reason))
		r.deadLetter(ctx, s, a.reason, s.d.Attempt+1)
		return
	case a.warn != "":
		r.warnAnswer(a.warn, s.d, res)
	}
	dead, wait, reason := retryVerdict(r.g.opts.Retry, s.d.Attempt, s.free, a.after, a.reason)
	next := *s.d // a new delivery per attempt (see entry.d)
	next.Attempt++
	s.d = &next
	if dead {
		span.End(observability.OutcomeDeadLetter, errors.New(reason))
		r.deadLetter(ctx, s, reason, s.d.Attempt)
		return
	}
	if a.outcome == observability.OutcomePanic {
		span.EndPanic(reason, nil)
	} else {
		span.End(a.outcome, errors.New(reason))
	}
	s.state = entryRetrying
	r.after(ctx, wait, &redeliver{inc: r, id: s.d.id})
	r.maybeFinishDrain(ctx)
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

// warnAnswer logs msg for the entry's answer, unless the group logged it for
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

// deadLetter records an entry's event, delivered attempts times, as a dead
// letter; the entry finishes when the row is written.
func (r *reader) deadLetter(ctx actor.Context, s *entry, reason string, attempts int) {
	s.state = entryDeadLettering
	d := s.d
	s.dl = &eventsource.DeadLetter{
		Subscription: d.Subscription, Generation: d.Generation, Bucket: d.Bucket, EventID: d.Event.ID,
		Position: d.Event.Position, Stream: d.Event.Stream, Reason: reason, Attempts: attempts,
	}
	r.writeDeadLetter(ctx, s)
}

// writeDeadLetter writes a dead-lettering entry's row.
func (r *reader) writeDeadLetter(ctx actor.Context, s *entry) {
	dl, id := *s.dl, s.d.id
	r.async(ctx, func(c context.Context) any {
		_, err := r.g.store.AddDeadLetter(c, dl)
		return &deadLettered{inc: r, id: id, err: err}
	})
}

func (r *reader) onDeadLettered(ctx actor.Context, m *deadLettered) {
	if r.wired() {
		r.wdeadLettered(ctx, m)
		return
	}
	s := r.win.byID[m.id]
	if s == nil || s.state != entryDeadLettering {
		return
	}
	if m.err != nil {
		err := fmt.Errorf("kumi: bucket %d: dead-letter: %w", r.bucket, m.err)
		if r.retryInPlace(ctx, err, &rewriteDeadLetter{inc: r, id: m.id}) {
			return
		}
		panic(err)
	}
	r.storeFailures = 0
	r.finish(ctx, s, false)
}

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

// finish marks an entry done, frees its stream, and moves the acknowledged
// position over the window's finished prefix.
func (r *reader) finish(ctx actor.Context, s *entry, committed bool) {
	s.state = entryDone
	delete(r.win.byID, s.d.id)
	delete(r.win.busy, s.d.Event.Stream)
	var a checkpointing.Ack
	done := 0
	for _, f := range r.win.entries {
		if f.state != entryDone {
			break
		}
		a.Through = f.last()
		a.Events += f.count()
		done++
	}
	r.win.dropFinished(done)
	if committed {
		a.Committed = s.last()
	}
	r.cpDo(ctx, r.cp.Finished(a))
	r.pump(ctx)
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

// maybeFinishDrain ends a drain once no entry is with the handler or being
// dead-lettered and the checkpoint is flushed — or, under an unsure lease,
// its write failed. The entries that sendOnDrain does not send are left to
// the next owner: the checkpoint stays before them.
func (r *reader) maybeFinishDrain(ctx actor.Context) {
	if !r.draining || r.stopped {
		return
	}
	if r.wired() {
		if !r.ws.drained {
			return // with the handler or the store, or to be sent once it is ready
		}
		r.endDrain(ctx)
		return
	}
	for _, s := range r.win.entries {
		if s.run != nil {
			s.run.cutShort() // it answers after the event in hand
		}
	}
	if r.sendOnDrain(ctx); r.stopped {
		return
	}
	if r.win.active() > 0 || len(r.drainSends()) > 0 {
		return // with the handler, or to be sent once it is ready
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

// sendOnDrain delivers, during a drain, the entries that keep the
// checkpoint before events already sent (see drainSends), once the
// handler is ready: a drain that begins while it is probed or replaced
// waits for its answer or its successor (beginDrain spawns one at once),
// and ends only when nothing more is to be sent. Nothing is sent under an
// unsure lease.
func (r *reader) sendOnDrain(ctx actor.Context) {
	if !r.handlerReady() {
		return // pump calls again once it is ready
	}
	for _, s := range r.drainSends() {
		if err := r.g.leases.EnsureHeld(r.bucket); err != nil {
			r.unsureLease(ctx, err)
			return
		}
		if s.state == entryRetrying || s.due {
			s.drainSent = true // the drain's one more attempt of a retried event
		}
		if s.state == entryRetrying {
			r.send(ctx, s)
		} else {
			r.sendFirst(ctx, s)
		}
		if r.stopped {
			return
		}
	}
}

// drainSends is what a drain has to send now: with MaxInFlight above 1,
// the entries before the window's last one that left the waiting state. A
// entry waiting behind an earlier event of its stream goes once its stream
// is free, as it would have; a retrying one (or one whose retry fell due
// while the handler was away) goes at once, not after its backoff — the
// next reader of the bucket, which starts from the checkpoint, would send
// it at once too — for one more attempt, charged to its retry budget.
// Left, they would keep the checkpoint before the events finished after
// them, and the next reader — the next owner after a handoff or a
// graceful stop, the reader spawned after an overflow — would deliver
// those again. The drain takes no new event, and each of these is
// bounded, like the events in flight, by HandlerTimeout. A retried entry
// answered Retry again (or a panic, or no answer in time) after its drain
// attempt is left, and so is everything after it not yet sent: the next
// reader repeats what was finished after it (see docs/guarantees.md).
// Nothing, under an unsure lease.
func (r *reader) drainSends() []*entry {
	if r.unsure != nil {
		return nil
	}
	last := -1 // the last entry that left the waiting state
	for i, s := range r.win.entries {
		if s.state != entryWaiting {
			last = i
		}
	}
	var out []*entry
	var taken map[string]bool // streams of entries taken here
	for _, s := range r.win.entries[:max(last, 0)] {
		stream := s.d.Event.Stream
		switch {
		case s.state == entryRetrying && s.drainSent:
			return out // left: whatever is sent after it would be repeated
		case s.state == entryRetrying:
		case s.state == entryWaiting && !r.win.busy[stream] && !taken[stream]:
		default:
			continue
		}
		if taken == nil {
			taken = map[string]bool{}
		}
		taken[stream] = true
		out = append(out, s)
	}
	return out
}

// beginDrain starts a drain (a handoff, a graceful stop, an overflow). A
// handler being replaced is spawned again at once, not after its backoff,
// when the drain has something to send: the drain would wait for it.
func (r *reader) beginDrain(ctx actor.Context) {
	r.draining = true
	if r.wired() {
		if !r.stopped {
			r.wstep(ctx, r.ws.st.Drain()) // a handler being replaced is spawned at once (SpawnNow)
		}
		return
	}
	if r.handler == nil && !r.stopped && len(r.drainSends()) > 0 {
		r.spawnHandler(ctx)
	}
	r.maybeFinishDrain(ctx)
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
	if r.wired() {
		r.wstep(ctx, r.ws.st.Unsure())
		return
	}
	r.maybeFinishDrain(ctx)
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
