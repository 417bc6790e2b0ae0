package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/observability"
)

// OverflowBatch marks a liveBatch as bounded by the reader's overflow queue.
func (*liveBatch) OverflowBatch() {}

// Messages between a reader, its coordinator and itself.
type (
	// drainReader asks a reader to finish its in-flight event, flush its
	// checkpoint and stop (handoff or graceful stop).
	drainReader struct{}
	// readerDrained tells the coordinator that a reader finished draining.
	readerDrained struct {
		Bucket   int
		Position int64
		Err      error
	}
	// readerLostFence tells the coordinator that a reader found its fence
	// gone (or its lease unsure) and stopped.
	readerLostFence struct {
		Bucket int
		Err    error
	}
	// readerProgress reports a flushed checkpoint.
	readerProgress struct {
		Bucket   int
		Position int64
	}

	checkpointLoaded struct {
		gen *reader
		pos int64
		err error
	}
	pageRead struct {
		gen    *reader
		events []eventsource.RecordedEvent
		target int64
		err    error
	}
	flushDone struct {
		gen *reader
		pos int64
		err error
	}
	deadLettered struct {
		gen *reader
		id  uint64
		err error
	}
	redeliver struct {
		gen *reader
		id  uint64
	}
	flushTick struct{ gen *reader }
)

// reader is the BucketReader: one per owned bucket, child of the
// coordinator. It catches up from its checkpoint through SQL, then follows
// the publisher's batches, delivers its events one at a time to its handler
// (so per-stream order holds), and moves the fenced checkpoint after acks.
type reader struct {
	g      *group
	bucket int
	epoch  int64
	fence  eventsource.Fence
	queue  *overflow.Queue

	handler *actor.PID
	bg      context.Context
	cancel  context.CancelFunc

	cursor     int64 // every event of the bucket up to here is queued or handled
	pending    []eventsource.RecordedEvent
	catching   bool
	reading    bool
	target     int64 // catch-up must cover at least this position
	inflight   *Delivery
	nextID     uint64
	acked      int64 // last handled position
	flushed    int64
	flushing   bool
	sinceFlush int
	draining   bool
	stopped    bool
	ready      bool
	held       bool // the queue is held (see updateHold)
	overflowed error
	span       observability.DeliverySpan
	sentAt     time.Time
	waiting    bool // the in-flight delivery awaits the handler's answer
	tick       time.Duration
}

func (r *reader) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		r.start(ctx)
	case *actor.Stopping:
		r.shutdown(ctx)
	case *actor.Restarting:
		r.shutdown(ctx)
	case *checkpointLoaded:
		if msg.gen != r {
			return
		}
		if msg.err != nil {
			panic(fmt.Errorf("kumi: bucket %d: load checkpoint: %w", r.bucket, msg.err))
		}
		r.cursor, r.acked, r.flushed = msg.pos, msg.pos, msg.pos
		r.ready = true
		r.readPage(ctx)
	case *pageRead:
		if msg.gen == r {
			r.onPage(ctx, msg)
		}
	case *liveBatch:
		r.onLive(ctx, msg)
	case *overflow.PausedSignal:
		// The queue dropped what it held; batches after the gap start
		// past our cursor and trigger a catch-up from the database.
		r.queue.Resume()
	case *overflow.OverflowedSignal:
		// The subscription ends with the typed error, but first the event
		// in flight is finished and the checkpoint flushed, so that the
		// next reader of the bucket repeats nothing.
		r.overflowed = msg.Err
		r.draining = true
		r.maybeFinishDrain(ctx)
	case *redeliver:
		if msg.gen == r && r.inflight != nil && r.inflight.id == msg.id && !r.waiting {
			if err := r.g.leases.EnsureHeld(r.bucket); err != nil {
				r.lostFence(ctx, err) // every delivery, a retry too, needs a lease it can trust
				return
			}
			r.send(ctx)
		}
	case *deadLettered:
		if msg.gen != r || r.inflight == nil || r.inflight.id != msg.id {
			return
		}
		if msg.err != nil {
			panic(fmt.Errorf("kumi: bucket %d: dead-letter: %w", r.bucket, msg.err))
		}
		r.done(ctx, false)
	case *flushDone:
		if msg.gen == r {
			r.onFlushed(ctx, msg)
		}
	case *flushTick:
		if msg.gen == r {
			r.flush(ctx, true)
			r.checkTimeout(ctx)
			r.after(ctx, r.tick, &flushTick{gen: r})
		}
	case *handlerReply:
		r.onHandlerReply(ctx, msg)
	case *drainReader:
		r.draining = true
		r.maybeFinishDrain(ctx)
	}
}

func (r *reader) start(ctx actor.Context) {
	r.bg, r.cancel = context.WithCancel(context.Background())
	r.catching = true // until the checkpoint is loaded and read through
	r.updateHold()
	_ = r.queue.Resume() // a restart clears a pause the last incarnation left
	r.handler = ctx.Spawn(handlerProps(r.g.opts.Handler, r.g.handlerSupervisor))
	ctx.Send(r.g.publisher, &subscribe{PID: ctx.Self(), Category: r.g.opts.Category, Size: r.g.opts.Buckets, Member: r.bucket})
	// One timer serves the checkpoint interval and the handler timeout.
	r.tick = min(r.g.opts.CheckpointInterval, max(r.g.opts.HandlerTimeout/4, time.Millisecond))
	r.after(ctx, r.tick, &flushTick{gen: r})
	r.async(ctx, func(c context.Context) any {
		pos, err := r.g.store.Checkpoint(c, r.g.opts.Subscription, r.bucket)
		return &checkpointLoaded{gen: r, pos: pos, err: err}
	})
}

func (r *reader) shutdown(ctx actor.Context) {
	if r.stopped {
		return
	}
	r.stopped = true
	if r.waiting {
		r.waiting = false
		r.span.End(observability.OutcomeCancelled, nil)
	}
	ctx.Send(r.g.publisher, &unsubscribe{PID: ctx.Self()})
	if r.cancel != nil {
		r.cancel()
	}
}

// async runs fn off the mailbox and posts its result to the reader.
func (r *reader) async(ctx actor.Context, fn func(context.Context) any) {
	self, root, bg := ctx.Self(), ctx.ActorSystem().Root, r.bg
	go func() {
		c, cancel := context.WithTimeout(bg, r.g.opts.DatabaseTimeout)
		defer cancel()
		msg := fn(c)
		if bg.Err() == nil {
			root.Send(self, msg)
		}
	}()
}

// after posts msg to the reader once d has passed, unless it stopped.
func (r *reader) after(ctx actor.Context, d time.Duration, msg any) {
	self, root, bg := ctx.Self(), ctx.ActorSystem().Root, r.bg
	time.AfterFunc(d, func() {
		if bg.Err() == nil {
			root.Send(self, msg)
		}
	})
}

// catchUp reads the bucket from the database until it covers target.
// Live batches stay in the (bounded) queue meanwhile, so that they cannot
// overtake the catch-up.
func (r *reader) catchUp(ctx actor.Context, target int64) {
	r.catching = true
	r.updateHold()
	r.target = max(r.target, target)
	r.readPage(ctx)
}

func (r *reader) readPage(ctx actor.Context) {
	if r.reading || len(r.pending) >= r.g.opts.BatchSize {
		return // a read is under way, or enough is queued: read on when it drains
	}
	r.reading = true
	from, limit, target := r.cursor, r.g.opts.BatchSize, r.target
	o := r.g.opts
	r.async(ctx, func(c context.Context) any {
		c, span := r.g.telemetry.startReaderFetch(c, r.bucket, from)
		events, err := r.g.store.ReadMember(c, o.Category, r.bucket, o.Buckets, from, limit)
		last := from
		if len(events) > 0 {
			last = events[len(events)-1].Position
		}
		span.End(len(events), last, err)
		return &pageRead{gen: r, events: events, target: target, err: err}
	})
}

func (r *reader) onPage(ctx actor.Context, p *pageRead) {
	r.reading = false
	if p.err != nil {
		panic(fmt.Errorf("kumi: bucket %d: catch-up read: %w", r.bucket, p.err))
	}
	for _, e := range p.events {
		if e.Position > r.cursor {
			r.pending = append(r.pending, e)
			r.cursor = e.Position
		}
	}
	if len(p.events) < r.g.opts.BatchSize {
		// Everything of the bucket up to the read's snapshot is queued, and
		// that snapshot covers every batch received before it was taken.
		r.cursor = max(r.cursor, p.target)
		if r.target > p.target {
			r.readPage(ctx) // a batch arrived while reading: read on
		} else {
			r.catching = false
			r.updateHold()
		}
	} else {
		r.readPage(ctx)
	}
	r.pump(ctx)
}

func (r *reader) onLive(ctx actor.Context, b *liveBatch) {
	if !r.ready || r.catching {
		// Taken before the hold: the catch-up reads through it instead.
		r.target = max(r.target, b.To)
		return
	}
	if b.From > r.cursor {
		// A gap: batches were dropped on overflow. Re-read from the store.
		r.catchUp(ctx, b.To)
		return
	}
	for _, e := range b.Events {
		if e.Position > r.cursor {
			r.pending = append(r.pending, e)
		}
	}
	r.cursor = max(r.cursor, b.To)
	r.updateHold()
	r.pump(ctx)
}

// updateHold keeps live batches in the bounded queue — where the overflow
// policy applies — while the reader catches up or already holds a batch's
// worth of events; it takes the next batch only when it has room.
func (r *reader) updateHold() {
	want := r.catching || len(r.pending) >= r.g.opts.BatchSize
	if want == r.held {
		return
	}
	r.held = want
	if want {
		r.queue.Hold()
	} else {
		r.queue.Release()
	}
}

// pump delivers the next pending event if none is in flight.
func (r *reader) pump(ctx actor.Context) {
	if r.inflight != nil || r.draining || len(r.pending) == 0 {
		r.maybeFinishDrain(ctx)
		return
	}
	if err := r.g.leases.EnsureHeld(r.bucket); err != nil {
		r.lostFence(ctx, err)
		return
	}
	e := r.pending[0]
	r.nextID++
	r.inflight = &Delivery{
		Event:        e,
		Subscription: r.g.opts.Subscription,
		Bucket:       r.bucket,
		Epoch:        r.epoch,
		Fence:        r.fence,
		id:           r.nextID,
	}
	r.send(ctx)
}

// send delivers the in-flight event (again) to the handler.
func (r *reader) send(ctx actor.Context) {
	d := *r.inflight // a copy per attempt: the handler may keep it
	d.replyTo = ctx.Self()
	d.Context, r.span = r.g.telemetry.startDelivery(r.bg, &d)
	r.sentAt, r.waiting = time.Now(), true
	ctx.Request(r.handler, &d)
}

// onHandlerReply matches a handler's answer to the delivery in flight.
func (r *reader) onHandlerReply(ctx actor.Context, m *handlerReply) {
	if r.inflight == nil || !r.waiting || m.id != r.inflight.id || m.attempt != r.inflight.Attempt || r.stopped {
		return // an answer to an attempt given up on (timeout), or to a stopped reader
	}
	r.waiting = false
	r.onReply(ctx, m.msg, nil, r.span)
}

var errHandlerTimeout = errors.New("kumi: the handler did not answer in time")

// checkTimeout treats a delivery unanswered for HandlerTimeout as a retry.
func (r *reader) checkTimeout(ctx actor.Context) {
	if r.inflight != nil && r.waiting && time.Since(r.sentAt) >= r.g.opts.HandlerTimeout {
		r.waiting = false
		r.onReply(ctx, nil, errHandlerTimeout, r.span)
	}
}

// onReply acts on the handler's answer to the in-flight delivery.
func (r *reader) onReply(ctx actor.Context, res any, err error, span observability.DeliverySpan) {
	d := r.inflight
	var retry time.Duration
	var reason string
	outcome := observability.OutcomeRetry
	switch m := res.(type) {
	case Ack, *Ack:
		span.End(observability.OutcomeAck, nil)
		committed := false
		if a, ok := m.(Ack); ok {
			committed = a.Committed
		} else if a, ok := m.(*Ack); ok && a != nil {
			committed = a.Committed
		}
		r.done(ctx, committed)
		return
	case DeadLetter:
		span.End(observability.OutcomeDeadLetter, errors.New(m.Reason))
		r.deadLetter(ctx, m.Reason, d.Attempt+1)
		return
	case *DeadLetter:
		span.End(observability.OutcomeDeadLetter, errors.New(m.Reason))
		r.deadLetter(ctx, m.Reason, d.Attempt+1)
		return
	case Retry:
		retry, reason = m.After, m.Reason
	case *Retry:
		retry, reason = m.After, m.Reason
	case *handlerPanicked:
		reason = fmt.Sprintf("handler panicked: %v", m.reason)
		outcome = observability.OutcomePanic
	default:
		if err != nil {
			reason = fmt.Sprintf("no reply within %v", r.g.opts.HandlerTimeout)
			outcome = observability.OutcomeTimeout
		} else {
			reason = fmt.Sprintf("unexpected reply %T: answer Ack, Retry or DeadLetter", res)
		}
	}
	d.Attempt++
	if d.Attempt >= r.g.opts.Retry.MaxAttempts {
		reason = fmt.Sprintf("retry budget of %d attempts spent; last: %s", r.g.opts.Retry.MaxAttempts, reason)
		span.End(observability.OutcomeDeadLetter, errors.New(reason))
		r.deadLetter(ctx, reason, d.Attempt)
		return
	}
	if outcome == observability.OutcomePanic {
		span.EndPanic(reason, nil)
	} else {
		span.End(outcome, errors.New(reason))
	}
	delay := max(retry, r.g.opts.Retry.Backoff.Next(d.Attempt))
	r.after(ctx, delay, &redeliver{gen: r, id: d.id})
}

// deadLetter records the in-flight event, delivered attempts times, as a
// dead letter, then moves on.
func (r *reader) deadLetter(ctx actor.Context, reason string, attempts int) {
	d := r.inflight
	dl := eventsource.DeadLetter{
		Subscription: d.Subscription, Bucket: d.Bucket, EventID: d.Event.ID,
		Position: d.Event.Position, Stream: d.Event.Stream, Reason: reason, Attempts: attempts,
	}
	id := d.id
	r.async(ctx, func(c context.Context) any {
		_, err := r.g.store.AddDeadLetter(c, dl)
		return &deadLettered{gen: r, id: id, err: err}
	})
}

// done moves past the in-flight event.
func (r *reader) done(ctx actor.Context, committed bool) {
	pos := r.inflight.Event.Position
	r.inflight = nil
	r.pending = r.pending[1:]
	if len(r.pending) == 0 {
		r.pending = nil
	}
	r.acked = pos
	if committed {
		r.flushed = max(r.flushed, pos)
	}
	r.sinceFlush++
	r.updateHold()
	if r.sinceFlush >= r.g.opts.CheckpointEvery {
		r.flush(ctx, false)
	}
	if r.catching {
		r.readPage(ctx)
	}
	r.pump(ctx)
}

// flush writes the checkpoint, fenced, unless a write is under way.
func (r *reader) flush(ctx actor.Context, force bool) {
	if r.flushing || r.acked <= r.flushed || (!force && r.sinceFlush < r.g.opts.CheckpointEvery) {
		return
	}
	r.flushing, r.sinceFlush = true, 0
	pos, o := r.acked, r.g.opts
	r.async(ctx, func(c context.Context) any {
		_, err := r.g.store.SaveCheckpoint(c, o.Subscription, r.bucket, pos, r.fence)
		return &flushDone{gen: r, pos: pos, err: err}
	})
}

func (r *reader) onFlushed(ctx actor.Context, f *flushDone) {
	r.flushing = false
	if f.err != nil {
		if errors.Is(f.err, eventsource.ErrFenceLost) {
			r.lostFence(ctx, f.err)
			return
		}
		panic(fmt.Errorf("kumi: bucket %d: checkpoint: %w", r.bucket, f.err))
	}
	r.flushed = max(r.flushed, f.pos)
	ctx.Send(ctx.Parent(), &readerProgress{Bucket: r.bucket, Position: r.flushed})
	r.maybeFinishDrain(ctx)
}

func (r *reader) maybeFinishDrain(ctx actor.Context) {
	if !r.draining || r.inflight != nil || r.stopped {
		return
	}
	if r.acked > r.flushed {
		r.flush(ctx, true)
		return
	}
	if r.flushing {
		return
	}
	if r.overflowed != nil {
		panic(r.overflowed) // a permanent error: supervision stops the reader
	}
	ctx.Send(ctx.Parent(), &readerDrained{Bucket: r.bucket, Position: r.flushed})
	r.shutdown(ctx)
	ctx.Stop(ctx.Self())
}

// lostFence stops the reader at once: another worker holds the bucket, or
// this one can no longer be sure it does.
func (r *reader) lostFence(ctx actor.Context, err error) {
	if r.stopped {
		return
	}
	r.g.telemetry.fenceLost(r.bucket, r.epoch, err)
	ctx.Send(ctx.Parent(), &readerLostFence{Bucket: r.bucket, Err: err})
	r.shutdown(ctx)
	ctx.Stop(ctx.Self())
}
