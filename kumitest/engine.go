package kumitest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/kitbridge"
	"github.com/kumi-run/kumi/observability"
)

// The engine is a group's bucket readers with the I/O taken out: one
// bucket's events go to its handler one delivery at a time (MaxInFlight
// of 1; a larger one only changes what CommitWithCheckpoint allows), its
// answer is read by actors' classifyAnswer, and a retry waits its backoff
// on the simulated clock. Buckets are served in order of simulated time,
// then position, so a retrying bucket lets the others go on, as readers
// do. Faults (plan) act at the points where a reader, a worker or the
// pool can fail.

// errNoAnswer is the timeout's error for classifyAnswer.
var errNoAnswer = errors.New("kumitest: no answer in time")

// handler is one incarnation of the handler actor of a bucket.
type handler struct {
	pid *actor.PID
	n   int
}

// call tracks one delivery's handling by the kit's middleware.
type call struct {
	start             atomic.Bool
	started, returned chan struct{}
}

// queue collects what the kit's collector actor receives.
type queue struct {
	mu     sync.Mutex
	items  []any
	signal chan struct{}
}

func (q *queue) put(m any) {
	q.mu.Lock()
	q.items = append(q.items, m)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *queue) take() []any {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}

// watch asks the collector to watch a handler.
type watch struct{ pid *actor.PID }

// bucket is one bucket's reader state.
type bucket struct {
	gen, bucket, n int
	slot           int
	all            []eventsource.RecordedEvent // the bucket's events of this generation, in order
	pending        []eventsource.RecordedEvent
	attempt, free  int
	alone          bool // a batch failed as a whole: its first event goes alone next
	readyAt        time.Duration
	epoch          int64
	fence          eventsource.Fence
	h              *handler
	acked          int64 // the last position acked
	sinceFlush     int
	flushed        int64
	redeliverTo    int64 // after a crash: deliveries up to here are its redeliveries
	handedOff      bool  // the next delivery is the first after a handoff
	split          bool  // the next batch was cut by BatchSplit
}

// engine runs one pass.
type engine struct {
	k       *Kit
	ctx     context.Context
	opts    actors.GroupOptions
	props   *actor.Props
	sub     string
	plan    *plan
	back    backend
	now     time.Duration
	res     *Result
	index   map[int64]int // position -> index in res.Outcomes
	inbox   *queue
	coll    *actor.PID
	mu      sync.Mutex
	calls   map[uint64]*call
	hung    []*call         // calls given up on, still running
	dead    map[string]bool // handlers that stopped (by pid id)
	handers []*handler
	nextH   int
}

// pass runs events once through the handler props user, under plan.
func (k *Kit) pass(ctx context.Context, user *actor.Props, events []eventsource.RecordedEvent, p *plan) (*Result, error) {
	k.passes++
	e := &engine{k: k, ctx: ctx, opts: k.opts.Group, plan: p, sub: k.opts.Group.Subscription,
		res: &Result{}, index: map[int64]int{}, calls: map[uint64]*call{}, dead: map[string]bool{},
		inbox: &queue{signal: make(chan struct{}, 1)}}
	e.opts.Retry.Backoff.Rand = p.rng.Float64 // jitter drawn from the seed: a pass replays
	if k.opts.Store != nil {
		e.sub = fmt.Sprintf("%s-kit%d", k.opts.Group.Subscription, k.passes)
	}
	for i, ev := range events {
		e.res.Outcomes = append(e.res.Outcomes, Outcome{Event: ev})
		e.index[ev.Position] = i
	}
	e.props = kitbridge.Props(user, k.sup).Configure(actor.WithReceiverMiddleware(e.track))
	e.coll = k.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *watch:
			c.Watch(m.pid)
		case *actor.Started, *actor.Stopping, *actor.Stopped:
		default:
			e.inbox.put(m)
		}
	}))
	defer k.system.Root.Stop(e.coll)
	back, err := k.backend(ctx, e.sub)
	if err != nil {
		return nil, err
	}
	e.back = back
	defer back.close()
	err = e.run(events)
	// Every handler is stopped and waited for, so what a handler does after
	// it responds (its effects, recorded once Respond has been called) is
	// done when Run returns.
	stopped := make([]*actor.Future, 0, len(e.handers))
	for _, h := range e.handers {
		stopped = append(stopped, k.system.Root.StopFuture(h.pid))
	}
	werr := e.waitHung()
	if err == nil {
		err = werr
	}
	if werr == nil {
		for _, f := range stopped {
			if serr := f.Wait(); serr != nil && err == nil {
				err = fmt.Errorf("kumitest: a handler did not stop after its last call: %w", serr)
			}
		}
	}
	e.res.Elapsed = e.now
	return e.res, err
}

// track is the kit's receiver middleware, innermost: it records when the
// user's code starts and returns from each delivery.
func (e *engine) track(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		id, ok := kitbridge.ID(env.Message)
		if !ok {
			next(c, env)
			return
		}
		cl := e.call(id)
		first := cl.start.CompareAndSwap(false, true)
		if first {
			close(cl.started)
			defer close(cl.returned)
		} // else: the handler sent the delivery to itself again
		next(c, env)
	}
}

func (e *engine) call(id uint64) *call {
	e.mu.Lock()
	defer e.mu.Unlock()
	cl := e.calls[id]
	if cl == nil {
		cl = &call{started: make(chan struct{}), returned: make(chan struct{})}
		e.calls[id] = cl
	}
	return cl
}

// waitHung waits for the calls given up on to return: their effects are
// the handler's too. Their contexts are cancelled.
func (e *engine) waitHung() error {
	wait := max(e.k.opts.AnswerWait, hungWait)
	for _, cl := range e.hung {
		select {
		case <-cl.returned:
		case <-time.After(wait):
			return fmt.Errorf("kumitest: a handler call given up on (its context cancelled) did not return within %v", wait)
		}
	}
	return nil
}

// hungWait is the least wait for a call given up on to return.
const hungWait = 10 * time.Second

// run delivers events: up to the plan's resize cut in generation 0, the
// rest in generation 1.
func (e *engine) run(events []eventsource.RecordedEvent) error {
	first, rest := events, []eventsource.RecordedEvent(nil)
	if c := e.plan.cut; c > 0 {
		i := slices.IndexFunc(events, func(ev eventsource.RecordedEvent) bool { return ev.Position > c })
		if i >= 0 {
			first, rest = events[:i], events[i:]
		}
	}
	if err := e.generation(0, e.opts.Buckets, first); err != nil {
		return err
	}
	if rest != nil {
		return e.generation(1, e.plan.cutN, rest)
	}
	return nil
}

// generation runs the buckets of generation gen, n of them, over events,
// to the end, and drains them (checkpoints flushed, handlers stopped).
func (e *engine) generation(gen, n int, events []eventsource.RecordedEvent) error {
	byBucket := map[int]*bucket{}
	var buckets []*bucket
	for _, ev := range events {
		b := eventsource.BucketOfHash(ev.Hash, n)
		if byBucket[b] == nil {
			byBucket[b] = &bucket{gen: gen, bucket: b, n: n, slot: eventsource.Slot(gen, b)}
			buckets = append(buckets, byBucket[b])
		}
		byBucket[b].all = append(byBucket[b].all, ev)
	}
	for _, b := range buckets {
		b.pending = b.all
		var err error
		if b.epoch, b.fence, err = e.back.lease(gen, b.bucket, n); err != nil {
			return err
		}
		e.spawn(b)
	}
	for {
		var next *bucket
		for _, b := range buckets {
			if len(b.pending) == 0 {
				continue
			}
			if next == nil || b.readyAt < next.readyAt || (b.readyAt == next.readyAt && b.pending[0].Position < next.pending[0].Position) {
				next = b
			}
		}
		if next == nil {
			break
		}
		e.now = max(e.now, next.readyAt)
		if err := e.step(next); err != nil {
			return err
		}
	}
	for _, b := range buckets {
		if err := e.flush(b); err != nil {
			return err
		}
		e.k.system.Root.Stop(b.h.pid)
	}
	return nil
}

// spawn starts a new handler actor for b.
func (e *engine) spawn(b *bucket) {
	e.nextH++
	h := &handler{pid: e.k.system.Root.SpawnPrefix(e.props, fmt.Sprintf("kumitest-%s-%d-", e.opts.Subscription, b.slot)), n: e.nextH}
	e.handers = append(e.handers, h)
	e.k.system.Root.Send(e.coll, &watch{pid: h.pid})
	b.h = h
}

// alive replaces b's handler if it stopped while another bucket's
// answer was awaited.
func (e *engine) alive(b *bucket) {
	for _, m := range e.inbox.take() {
		if t, ok := m.(*actor.Terminated); ok {
			e.dead[t.Who.Id] = true
		}
	}
	if e.dead[b.h.pid.Id] {
		e.spawn(b)
	}
}

// replace stops b's handler (taking effect when its call returns) and
// spawns the next.
func (e *engine) replace(b *bucket) {
	e.k.system.Root.Stop(b.h.pid)
	e.spawn(b)
}

// flush writes b's checkpoint at what it acked.
func (e *engine) flush(b *bucket) error {
	if b.acked <= b.flushed {
		return nil
	}
	b.sinceFlush = 0
	b.flushed = b.acked
	return e.back.flush(e.sub, b.slot, b.acked, b.fence)
}

// send delivers events (one, or a batch) at b's attempt and waits for the
// answer: it returns the delivery's record and the answer, or
// errNoAnswer (no answer in time) or errStopped (the handler stopped).
func (e *engine) send(b *bucket, events []eventsource.RecordedEvent, f Fault) (d *Delivery, res any, err error) {
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	m := kitbridge.Message{Event: events[0], Attempt: b.attempt, Subscription: e.sub, Generation: b.gen, Bucket: b.bucket,
		Epoch: b.epoch, Fence: b.fence, Context: ctx, ReplyTo: e.coll, Exclusive: e.opts.MaxInFlight == 1}
	if e.opts.Batch.MaxEvents > 0 {
		m.Events = events
	}
	msg, id := kitbridge.Deliver(m)
	e.alive(b)
	d = e.record(b, events, f)
	cl := e.call(id)
	e.k.system.Root.RequestWithCustomSender(b.h.pid, msg, e.coll)
	res, err = e.await(b, id, cl)
	return d, res, err
}

// record adds a delivery to the result.
func (e *engine) record(b *bucket, events []eventsource.RecordedEvent, f Fault) *Delivery {
	if f == "" && b.redeliverTo >= events[0].Position {
		f = CrashTail
	}
	if f == "" && b.handedOff {
		f = Handoff
	}
	if f == "" && b.gen > 0 {
		f = ResizeCut
	}
	if f == "" && b.split {
		f = BatchSplit
	}
	b.handedOff, b.split = false, false
	e.res.Deliveries = append(e.res.Deliveries, Delivery{Event: events[0], Events: len(events), Attempt: b.attempt,
		Generation: b.gen, Bucket: b.bucket, Epoch: b.epoch, Handler: b.h.n, At: e.now, Fault: f})
	return &e.res.Deliveries[len(e.res.Deliveries)-1]
}

// await waits for the answer to delivery id: the answer, or errNoAnswer
// once AnswerWait passes or the handler stopped.
func (e *engine) await(b *bucket, id uint64, cl *call) (any, error) {
	timer := time.NewTimer(e.k.opts.AnswerWait)
	defer timer.Stop()
	for {
		for _, m := range e.inbox.take() {
			if r, ok := kitbridge.Unwrap(m); ok && r.ID == id {
				return r.Msg, nil
			}
			if t, ok := m.(*actor.Terminated); ok {
				e.dead[t.Who.Id] = true
				if t.Who.Equal(b.h.pid) {
					// Stopped (its supervisor's budget spent, or by itself):
					// the reader replaces it and sends the event again,
					// uncharged.
					e.spawn(b)
					return nil, errStopped
				}
			}
		}
		select {
		case <-e.inbox.signal:
		case <-timer.C:
			select {
			case <-cl.started:
				select {
				case <-cl.returned:
				default:
					// Still in the call: hung. The reader replaces it.
					e.hung = append(e.hung, cl)
					e.replace(b)
				}
			default: // not started: slow, not hung
			}
			return nil, errNoAnswer
		case <-e.ctx.Done():
			return nil, e.ctx.Err()
		}
	}
}

// errStopped: the handler stopped with the delivery unanswered.
var errStopped = errors.New("kumitest: the handler stopped")

// step makes b's next delivery and acts on its answer.
func (e *engine) step(b *bucket) error {
	head := b.pending[0]
	if b.attempt == 0 && e.plan.take(e.plan.handoff, head.Position) {
		// A cooperative handoff: the reader drains and flushes, the next
		// owner starts after the checkpoint with a handler of its own.
		if err := e.flush(b); err != nil {
			return err
		}
		e.k.system.Root.Stop(b.h.pid)
		var err error
		if b.epoch, b.fence, err = e.back.move(b.gen, b.bucket, b.n); err != nil {
			return err
		}
		e.spawn(b)
		b.handedOff = true
	}
	events := e.batch(b)
	if b.attempt == 0 && e.plan.take(e.plan.timeout, head.Position) {
		return e.timeout(b, events)
	}
	d, res, err := e.send(b, events, "")
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, errNoAnswer) {
		e.now += e.opts.HandlerTimeout // the reader waited that long
	}
	for _, ev := range events { // a batch crashes at any of its events
		if e.plan.take(e.plan.crash, ev.Position) {
			d.Ignored, d.Outcome = true, observability.OutcomeCancelled
			return e.crash(b, events[len(events)-1].Position)
		}
	}
	if errors.Is(err, errStopped) {
		d.Outcome, d.Reason = observability.OutcomeCancelled, err.Error()
		b.attempt++
		b.free++
		return nil
	}
	return e.settle(b, events, res, err, d)
}

// batch returns the events of b's next delivery: its head, and with
// batches the pending events that follow, within Batch's bounds.
func (e *engine) batch(b *bucket) []eventsource.RecordedEvent {
	o := e.opts.Batch
	if o.MaxEvents == 0 {
		return b.pending[:1]
	}
	limit := o.MaxEvents
	if b.alone {
		limit = 1
	}
	natural := limit
	if e.plan.split && limit > 1 {
		limit = 1 + e.plan.rng.IntN(limit)
	}
	n, size := 1, len(b.pending[0].Data)+len(b.pending[0].Metadata)
	for n < len(b.pending) && n < limit {
		next := b.pending[n]
		size += len(next.Data) + len(next.Metadata)
		if o.MaxBytes > 0 && size > o.MaxBytes {
			break
		}
		if e.plan.handoff[next.Position] || e.plan.timeout[next.Position] {
			break // a fault at an event acts on the delivery it heads
		}
		n++
	}
	b.split = n == limit && limit < natural && n < len(b.pending)
	return b.pending[:n]
}

// timeout delivers events to b's handler, which is given up on while it
// runs: HandlerTimeout passes, the delivery's context is cancelled, the
// handler is replaced, and the retry goes to its successor while the
// first call may still be running.
func (e *engine) timeout(b *bucket, events []eventsource.RecordedEvent) error {
	ctx, cancel := context.WithCancel(e.ctx)
	m := kitbridge.Message{Event: events[0], Attempt: b.attempt, Subscription: e.sub, Generation: b.gen, Bucket: b.bucket,
		Epoch: b.epoch, Fence: b.fence, Context: ctx, ReplyTo: e.coll, Exclusive: e.opts.MaxInFlight == 1}
	if e.opts.Batch.MaxEvents > 0 {
		m.Events = events
	}
	msg, id := kitbridge.Deliver(m)
	d := e.record(b, events, TimeoutRetry)
	cl := e.call(id)
	e.k.system.Root.RequestWithCustomSender(b.h.pid, msg, e.coll)
	select { // the reader gives up on a call in progress
	case <-cl.started:
	case <-time.After(e.k.opts.AnswerWait):
	}
	e.now += e.opts.HandlerTimeout
	cancel()
	e.hung = append(e.hung, cl)
	e.replace(b)
	d.Ignored = true
	a := kitbridge.Classify(nil, errNoAnswer, e.opts.HandlerTimeout)
	d.Outcome, d.Reason = a.Outcome, a.Reason
	if e.opts.Batch.MaxEvents > 0 {
		e.failedWhole(b, events)
	}
	return e.retry(b, a, d)
}

// crash: the worker dies after the handler handled events up to pos,
// before its answer counted. The next owner, at a new epoch, with a new
// handler, starts from a checkpoint anywhere between the last one written
// and the last event acked, and delivers the tail again.
func (e *engine) crash(b *bucket, pos int64) error {
	e.k.system.Root.Stop(b.h.pid)
	var err error
	if b.epoch, b.fence, err = e.back.move(b.gen, b.bucket, b.n); err != nil {
		return err
	}
	e.spawn(b)
	var candidates []int64
	candidates = append(candidates, b.flushed)
	for _, ev := range b.all {
		if ev.Position > b.flushed && ev.Position <= b.acked {
			candidates = append(candidates, ev.Position)
		}
	}
	from := candidates[e.plan.rng.IntN(len(candidates))]
	b.pending = nil
	for i, ev := range b.all {
		if ev.Position > from {
			b.pending = b.all[i:]
			break
		}
	}
	b.redeliverTo = max(b.redeliverTo, pos)
	b.attempt, b.free, b.alone, b.sinceFlush = 0, 0, false, 0
	b.flushed, b.acked = from, from
	return nil
}

// settle acts on the answer to a delivery of events, as a reader does.
func (e *engine) settle(b *bucket, events []eventsource.RecordedEvent, res any, err error, d *Delivery) error {
	if e.opts.Batch.MaxEvents > 0 {
		var done, committed bool
		var serr error
		if res, done, committed, serr = e.settleBatch(b, events, res, d); serr != nil {
			return serr
		}
		if done {
			return e.acked(b, events, committed, d)
		}
	}
	a := kitbridge.Classify(res, err, e.opts.HandlerTimeout)
	if d.Outcome == "" {
		d.Outcome, d.Reason = a.Outcome, a.Reason
	}
	switch a.Outcome {
	case observability.OutcomeAck:
		return e.acked(b, events[:1], a.Committed, d)
	case observability.OutcomeDeadLetter:
		return e.deadLetter(b, a.Reason, b.attempt+1)
	}
	return e.retry(b, a, d)
}

// failedWhole: a batch failed as a whole, without saying where, as the
// reader's batchFailed takes it: its first event goes alone next, and a
// batch of more than one event fails at no event's charge.
func (e *engine) failedWhole(b *bucket, events []eventsource.RecordedEvent) {
	b.alone = true
	if len(events) > 1 {
		b.free++
	}
}

// settleBatch applies a batch's answer, read by actors'
// classifyBatchAnswer as the reader's settleBatch reads it: done reports
// the whole batch acked; otherwise the prefix it says is done is acked,
// and next is the answer for the first event not done, for
// classifyAnswer.
func (e *engine) settleBatch(b *bucket, events []eventsource.RecordedEvent, res any, d *Delivery) (next any, done, committed bool, err error) {
	m := kitbridge.ClassifyBatch(res, len(events))
	switch {
	case m.Alone:
		e.failedWhole(b, events)
		return m.Next, false, false, nil
	case m.All:
		d.Outcome = observability.OutcomeAck
		return nil, true, m.Committed, nil
	case m.Done > 0:
		if err := e.acked(b, events[:m.Done], m.Committed, nil); err != nil {
			return nil, false, false, err
		}
		b.alone = false
	}
	return m.Next, false, false, nil
}

// acked moves b past events, acked.
func (e *engine) acked(b *bucket, events []eventsource.RecordedEvent, committed bool, d *Delivery) error {
	if d != nil && d.Outcome == "" {
		d.Outcome = observability.OutcomeAck
	}
	for _, ev := range events {
		e.done(ev, b.attempt+1, func(o *Outcome) { o.Acked, o.Committed = true, committed })
		b.attempt, b.free = 0, 0
	}
	b.pending = b.pending[len(events):]
	b.attempt, b.free = 0, 0
	last := events[len(events)-1].Position
	b.acked = max(b.acked, last)
	b.sinceFlush += len(events)
	if committed {
		b.flushed = max(b.flushed, last)
	}
	if b.sinceFlush >= e.opts.CheckpointEvery {
		if err := e.flush(b); err != nil {
			return err
		}
	}
	if d == nil {
		return nil
	}
	for _, ev := range events { // a batch is delivered again whole
		if e.plan.take(e.plan.dup, ev.Position) {
			return e.duplicate(b, events)
		}
	}
	return nil
}

// duplicate delivers events again, as a zombie or an earlier owner
// would; its answer changes nothing.
func (e *engine) duplicate(b *bucket, events []eventsource.RecordedEvent) error {
	attempt := b.attempt
	b.attempt = 0
	d, res, err := e.send(b, events, Duplicates)
	b.attempt = attempt
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	a := kitbridge.Classify(res, err, e.opts.HandlerTimeout)
	d.Outcome, d.Reason, d.Ignored = a.Outcome, a.Reason, true
	return nil
}

// retry charges b's head event an attempt and schedules the next, or
// dead-letters it once the budget is spent.
func (e *engine) retry(b *bucket, a kitbridge.Meaning, d *Delivery) error {
	dead, wait, why := kitbridge.RetryVerdict(e.opts.Retry.MaxAttempts, e.opts.Retry.Backoff, b.attempt, b.free, a.After, a.Reason)
	b.attempt++
	if dead {
		if !d.Ignored {
			d.Outcome = observability.OutcomeDeadLetter
		}
		return e.deadLetter(b, why, b.attempt)
	}
	b.readyAt = e.now + wait
	return nil
}

// deadLetter records b's head event as a dead letter, delivered attempts
// times, and moves on.
func (e *engine) deadLetter(b *bucket, reason string, attempts int) error {
	ev := b.pending[0]
	if err := e.back.deadLetter(eventsource.DeadLetter{Subscription: e.sub, Generation: b.gen, Bucket: b.bucket,
		EventID: ev.ID, Position: ev.Position, Stream: ev.Stream, Reason: reason, Attempts: attempts}); err != nil {
		return fmt.Errorf("kumitest: dead-letter %s@%d: %w", ev.Stream, ev.Version, err)
	}
	e.done(ev, attempts, func(o *Outcome) { o.DeadLetter = reason })
	b.pending = b.pending[1:]
	b.attempt, b.free, b.alone = 0, 0, false
	b.acked = max(b.acked, ev.Position)
	b.sinceFlush++
	return nil
}

// done records an event's outcome, the first time it is done.
func (e *engine) done(ev eventsource.RecordedEvent, attempts int, set func(*Outcome)) {
	i, ok := e.index[ev.Position]
	if !ok {
		return
	}
	o := &e.res.Outcomes[i]
	if o.Acked || o.DeadLetter != "" {
		return
	}
	o.Attempts = attempts
	set(o)
}
