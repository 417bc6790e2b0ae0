package actors

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/coordplan"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

type (
	passTick struct{}
	passDone struct {
		// inc is the coordinator incarnation whose pass it is: a pass
		// that ends between a failure and the restart posts its result
		// to the restarted incarnation (same PID), which ignores it.
		inc   *coordinator
		res   leasestore.PassResult
		err   error
		ctx   context.Context
		span  observability.ReconcileSpan
		start time.Time
		dur   time.Duration
	}
	handedOver struct {
		bucket int
		start  time.Time
		err    error
	}
	stopGroup struct{}
	groupLeft struct{ err error }
	// readerGone follows a reader's Terminated, behind the reader's last
	// messages (see coordplan.State.Terminated).
	readerGone struct {
		// inc is the coordinator incarnation that saw the reader end: a
		// reader of the incarnation before a restart is no reader of this
		// one (its ids start over).
		inc  *coordinator
		slot int
		id   coordplan.ID
	}
	// inspectCoordinator runs on the coordinator's goroutine with the
	// coordinator: the tests' failure reports find its readers through it
	// (see diagnose_test.go).
	inspectCoordinator func(*coordinator)
)

// readerRef is the coordinator's handle on one of its readers; what it
// decides of the reader is in its plan (coordplan.Reader, by the same slot
// and id).
type readerRef struct {
	pid   *actor.PID
	id    coordplan.ID
	epoch int64
	queue *overflow.Queue
	// drain is draining for the reader's own goroutine: a reader its
	// supervisor restarts drains as well, if asked to (the coordinator
	// asks once).
	drain atomic.Bool
	// resize is what the reader was last told of the resize. A reader
	// restarted by its supervisor starts from it, not from what it was
	// spawned with: the coordinator tells a change once (see spawn).
	resize atomic.Pointer[resizeTold]
	// handled is where the slot's readers at epoch, in this process,
	// handled every event through: each incarnation leaves its acked
	// position (and what its run in flight finished, see handledThrough)
	// here when it stops or restarts (see reader.resumeAt). It is the
	// slot's mark at epoch, kept on the group (see handledMarks).
	handled *handledMark
}

// handledMark is a position through which a slot's events were all
// handled (acked or dead-lettered) by this process at one epoch. It only
// grows. A reader writes it on its own goroutine; the coordinator and the
// slot's next reader at the epoch (or the reader's next incarnation) read
// it. left is the event after it that the last reader stopped with,
// retrying (see leftRetry). The group keeps it (see handledMarks).
type handledMark struct {
	pos  atomic.Int64
	left atomic.Pointer[leftRetry]
	// written is the checkpoint the slot's last reader wrote, as it
	// stopped: the mark above it is handled and not yet checkpointed.
	written atomic.Int64
	// server is the store's server epoch the mark belongs to (see
	// handledMarks.at).
	server int64
}

// note raises the mark to pos.
func (h *handledMark) note(pos int64) {
	if h == nil {
		return
	}
	for {
		cur := h.pos.Load()
		if pos <= cur || h.pos.CompareAndSwap(cur, pos) {
			return
		}
	}
}

// load is the mark; 0 for none.
func (h *handledMark) load() int64 {
	if h == nil {
		return 0
	}
	return h.pos.Load()
}

// leftRetry is the event a reader stopped with delivered and not finished
// — waiting out a retry's backoff (an unsure reader sends nothing more,
// and leaves it), or given up with the handler by a stop at once — with
// its attempts so far (see reader.leftRetry). The reader spawned next at
// the same epoch (or the restarted one) goes on with them: it sends the
// event at once, as the retry it is, Attempt one above the last, charged
// to the same budget; not as a new event. The same worker at the same
// epoch delivers no event twice as a first attempt, and an event that
// keeps failing across such stops still uses up its retry budget. One
// whose dead letter was being written (letter) is not sent again: its
// successor writes the letter again (an upsert on the event) and goes on.
type leftRetry struct {
	pos           int64
	attempt, free int
	letter        *eventsource.DeadLetter
}

// handledMarks is, by slot, the mark of what the slot's readers handled
// in this process at one epoch: each reader of the slot at that epoch
// starts after it (see reader.resumeAt), and leaves its own there as it
// stops. The marks live on the group, not on the coordinator: a
// coordinator restarted by its supervisor stops its readers with it, and
// the readers its next incarnation spawns at the same epochs start after
// what those handled, as the readers one coordinator spawns again do.
// protoactor restarts an actor only once all its children have stopped
// (their Terminated received), and a reader leaves its mark in its
// shutdown, before it stops: the marks the next incarnation reads are
// complete. A mark is kept only while every pass reports its slot held at
// its epoch (see coordinator.forgetMarks). The coordinator calls it — its
// incarnations one after the other — and each reader as it starts, for its
// own slot; the readers only write their own mark, through its atomics.
type handledMarks struct {
	mu     sync.Mutex
	bySlot map[int]*slotMark
}

// slotMark is a slot's mark at an epoch, on the store's server of a
// server epoch (see eventsource.Store.Server).
type slotMark struct {
	epoch int64
	mark  handledMark
}

// at returns the mark of slot at epoch on the server of epoch server —
// what the slot's earlier readers at epoch left, or a new mark if the slot
// has none at that epoch — for the reader spawned next. A mark of another
// server is not taken: its positions may be handed out again to other
// events (a failover), and a reader that started after it would skip
// them. A reader that starts in another server epoch than its mark's
// takes its mark again (see reader.start).
func (m *handledMarks) at(slot int, epoch, server int64) *handledMark {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.bySlot[slot]; s != nil && s.epoch == epoch && s.mark.server == server {
		return &s.mark
	}
	if m.bySlot == nil {
		m.bySlot = map[int]*slotMark{}
	}
	s := &slotMark{epoch: epoch}
	s.mark.server = server
	m.bySlot[slot] = s
	return &s.mark
}

// unwritten lists the marks above their slots' written checkpoints, on
// the server of epoch server, of slot (of every slot if slot is -1): what
// the slots' readers handled and could not checkpoint before they stopped
// (an unsure lease, a failed last write). A slot forgotten by the plan
// since (a reader's lost or unsure lease) may still be held at the mark's
// epoch: its write, fenced at that epoch, lands only then.
func (m *handledMarks) unwritten(slot int, server int64) []unwrittenMark {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []unwrittenMark
	for sl, s := range m.bySlot {
		if (slot >= 0 && sl != slot) || s.mark.server != server {
			continue
		}
		if pos := s.mark.pos.Load(); pos > s.mark.written.Load() {
			out = append(out, unwrittenMark{slot: sl, epoch: s.epoch, server: server, pos: pos})
		}
	}
	return out
}

// unwrittenMark is a slot's handled mark not yet checkpointed.
type unwrittenMark struct {
	slot               int
	epoch, server, pos int64
}

// writeMarks checkpoints marks, fenced, before the coordinator hands
// their slots over or leaves: the slot's next owner then starts after
// what was handled here, not at the older checkpoint. No reader of the
// slot runs (a reader writes its own, and resumes after the mark); a
// failed write (a lease lost meanwhile) only leaves the next owner to
// deliver those events again.
func (c *coordinator) writeMarks(ctx context.Context, marks []unwrittenMark) {
	for _, m := range marks {
		_, err := c.g.store.SaveCheckpoint(ctx, c.g.opts.Subscription, m.slot, m.pos, c.g.store.ServerFence(m.server, c.g.leases.Fence(m.slot, m.epoch)))
		c.g.logger.Debug("kumi: the handled mark checkpointed before the slot goes", "slot", m.slot, "epoch", m.epoch,
			"position", m.pos, "err", err)
	}
}

// forget drops the mark of every slot for which keep reports false.
func (m *handledMarks) forget(keep func(slot int, epoch int64) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for slot, s := range m.bySlot {
		if !keep(slot, s.epoch) {
			delete(m.bySlot, slot)
		}
	}
}

// coordinator is the one actor per process per subscription group. It owns
// the reconcile timer: each pass (run off the mailbox) heartbeats
// its worker row, renews, claims up to the fair share and sheds surplus by
// handoff; the coordinator then brings its BucketReader children in line.
// What it decides — which readers to spawn, stop, drain and tell, which
// slots to hand over, when to leave — is its plan's (internal/coordplan, a
// pure function of what it knows and each input); the actor feeds the
// plan the pass results and its readers' reports and carries out the
// actions it returns (see do).
type coordinator struct {
	g       *group
	plan    *coordplan.State
	readers map[int]*readerRef // by slot, as in plan.Readers
	passing bool
	again   bool
	cancel  context.CancelFunc
	bg      context.Context
	// renewed is when the last successful pass started.
	renewed time.Time
	// stopped is closed when the actor has stopped, its children first.
	stopped chan struct{}
	// readerMailbox, when set, gives the mailbox middlewares of every
	// reader spawned from then on. Only tests set it (through
	// inspectCoordinator): they watch a reader's last messages with it.
	readerMailbox func(leasestore.Lease) []actor.MailboxMiddleware
}

func (c *coordinator) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		c.start(ctx)
	case *actor.Stopped:
		if c.stopped != nil {
			close(c.stopped)
		}
	case *actor.Stopping:
		c.halt()
		c.onStopping()
	case *actor.Restarting:
		c.halt()
	case passTick:
		c.pass(ctx)
	case *passDone:
		c.onPass(ctx, msg)
	case *readerDrained:
		// The reader stops itself; its Terminated (acted on behind this,
		// see readerGone) removes it, and then the bucket is handed over
		// (or, when leaving, released by Leave).
		c.g.setProgress(msg.Bucket, msg.Position)
	case *handedOver:
		c.g.telemetry.lease(context.Background(), observability.LeaseHandoffGive, msg.start, msg.err)
		if msg.err != nil {
			c.g.logger.Warn("kumi: handoff failed; the next pass retries", "bucket", msg.bucket, "err", msg.err)
		} else {
			c.g.telemetry.ownership(context.Background(), observability.ChangeHandoffGive, msg.bucket, c.plan.Owned[msg.bucket].Epoch, "", "drained for a claimant", "", nil)
		}
		c.do(ctx, c.plan.HandedOver(msg.bucket, msg.err == nil))
	case *readerLostFence:
		acts := c.plan.LostFence(msg.Bucket, msg.Epoch)
		for _, a := range acts {
			if a.Kind == coordplan.Forgot {
				c.g.logger.Info("kumi: reader stopped on a lost or unsure lease", "bucket", a.Slot, "epoch", a.Epoch, "err", msg.Err)
			}
		}
		c.do(ctx, acts)
	case *readerProgress:
		c.g.setProgress(msg.Bucket, msg.Position)
	case *readerCutDrained:
		c.g.setProgress(msg.Bucket, msg.Position)
		c.do(ctx, c.plan.CutDrained(msg.Bucket, msg.Epoch))
	case *actor.Terminated:
		// A system message: it overtakes the reader's last messages, still
		// queued (readerCutDrained, readerLostFence, readerDrained). The
		// plan acts on it behind them (coordplan.State.Terminated), on
		// readerGone.
		gone := &readerGone{inc: c}
		for slot, ref := range c.readers {
			if ref.pid.Equal(msg.Who) {
				gone.slot, gone.id = slot, ref.id
				c.do(ctx, c.plan.Terminated(slot, ref.id))
			}
		}
		ctx.Send(ctx.Self(), gone)
	case *readerGone:
		// What the reader handled stays in the slot's mark, for the
		// slot's next reader at its epoch (see handledMarks).
		if msg.inc != c {
			msg.id = 0
		}
		c.do(ctx, c.plan.Gone(msg.slot, msg.id))
	case inspectCoordinator:
		msg(c)
	case *releasesAsked:
		c.onReleasesAsked(ctx, msg)
	case stopGroup:
		c.do(ctx, c.plan.BeginLeave())
	case *groupLeft:
		c.g.finish(msg.err)
		ctx.Stop(ctx.Self())
	}
}

// halt is the first step of a stop or a restart: the readers stop with the
// coordinator, and none may be spawned again meanwhile.
func (c *coordinator) halt() {
	if c.plan != nil {
		c.plan.Halt()
	}
	if c.cancel != nil {
		c.cancel()
	}
}

func (c *coordinator) start(ctx actor.Context) {
	c.plan, c.readers = coordplan.New(), map[int]*readerRef{}
	c.bg, c.cancel = context.WithCancel(c.g.life)
	c.stopped = make(chan struct{})
	self, root, bg := ctx.Self(), ctx.ActorSystem().Root, c.bg
	changes, origin, interval := c.g.leases.Changes(), c.g.rt.beat, c.g.interval
	go func() {
		// The heartbeats fall at the runtime's beats (origin + n ×
		// interval), the same for every group with this interval: their
		// passes share a round trip (leasestore.PassBatcher).
		t := time.NewTimer(nextBeat(origin, interval))
		defer t.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case <-t.C:
			case <-changes:
			}
			t.Reset(nextBeat(origin, interval)) // (go ≥ 1.23: no stale tick after a Reset)
			root.Send(self, passTick{})
		}
	}()
	go c.g.measureLags(bg)
	c.pass(ctx)
}

// pass runs one reconcile pass off the mailbox; ticks during a pass are
// folded into one more pass after it.
func (c *coordinator) pass(ctx actor.Context) {
	if c.plan.Leaving || c.plan.Halted {
		return
	}
	if c.passing {
		c.again = true
		return
	}
	c.passing, c.again = true, false
	self, root, bg, g := ctx.Self(), ctx.ActorSystem().Root, c.bg, c.g
	go func() {
		cctx, cancel := context.WithTimeout(bg, g.opts.DatabaseTimeout)
		defer cancel()
		sctx, span := g.telemetry.startReconcile(context.Background())
		start := time.Now()
		res, err := g.leases.Pass(cctx)
		done := &passDone{inc: c, res: res, err: err, ctx: sctx, span: span, start: start, dur: time.Since(start)}
		if bg.Err() == nil {
			root.Send(self, done)
		} else {
			span.End(observability.PassSummary{Err: bg.Err()})
		}
	}()
}

func (c *coordinator) onPass(ctx actor.Context, p *passDone) {
	if p.inc != c {
		// A pass of the incarnation before a restart: what it found may
		// be older than this incarnation's own passes, and this
		// incarnation's pass under way is not done. Its own first pass,
		// at its start, reads the leases anew.
		p.span.End(observability.PassSummary{Err: errors.New("a pass of the coordinator before its restart")})
		return
	}
	c.passing = false
	defer func() {
		if c.again {
			c.pass(ctx)
		}
	}()
	c.g.telemetry.lease(p.ctx, observability.LeaseRenew, p.start, p.err)
	if p.err != nil {
		p.span.End(observability.PassSummary{Owned: len(c.plan.Owned), Err: p.err})
		c.g.passFailed(p.err)
		c.g.logger.Warn("kumi: reconcile pass failed; keeping the current readers", "err", p.err)
		return
	}
	c.checkLate(p)
	res := p.res
	summary := c.g.telemetry.passChanges(p.ctx, res, c.plan.Owned, c.plan.HandOff)
	p.span.End(summary)
	if c.plan.Leaving {
		return
	}
	prev := c.plan.Resize
	acts := c.plan.Pass(res)
	c.noteResize(prev, res.Resize)
	c.g.setPass(res, p.start)
	c.do(ctx, acts)
	c.askReleases(ctx)
}

// checkLate reports a successful pass that ran late: one that took longer
// than the heartbeat, or that ended more than two heartbeats after the
// start of the last successful one (the leases went that long without
// renewal).
func (c *coordinator) checkLate(p *passDone) {
	hb := c.g.interval
	gap := time.Duration(0)
	if !c.renewed.IsZero() {
		gap = p.start.Add(p.dur).Sub(c.renewed)
	}
	c.renewed = p.start
	if p.dur > hb || gap > 2*hb {
		cfg := c.g.leases.Config()
		c.g.telemetry.t.LeasePassLate(p.ctx, observability.LatePass{
			Subscription: c.g.opts.Subscription, Worker: c.g.leases.Worker(),
			Duration: p.dur, Gap: gap, Heartbeat: hb, TTL: cfg.TTL, Margin: cfg.Margin,
		})
	}
}

// do carries out the plan's actions, in order (see coordplan.Action), and
// then publishes what the group owns.
func (c *coordinator) do(ctx actor.Context, acts []coordplan.Action) {
	for _, a := range acts {
		ref := c.readers[a.Slot]
		if ref != nil && ref.id != a.Reader {
			ref = nil // (an action names a reader only for Stop, Drain, Tell)
		}
		switch a.Kind {
		case coordplan.ForgetMarks:
			c.g.marks.forget(func(slot int, epoch int64) bool {
				e, ok := a.Keep[slot]
				return ok && e == epoch
			})
		case coordplan.Released:
			c.g.telemetry.ownership(context.Background(), observability.ChangeRelease, a.Slot, a.Epoch, "", a.Why, "", nil)
		case coordplan.Stop:
			if ref != nil {
				ctx.Stop(ref.pid)
			}
		case coordplan.Drain:
			if ref != nil {
				ref.drain.Store(true)
				ctx.Send(ref.pid, &drainReader{})
			}
		case coordplan.HandOver:
			c.handOver(ctx, a.Slot)
		case coordplan.Spawn:
			c.spawn(ctx, a)
		case coordplan.Tell:
			if ref != nil {
				m := resizeTold{epoch: a.Epoch, told: a.Told}
				ref.resize.Store(&m)
				ctx.Send(ref.pid, &m)
			}
		case coordplan.Pass:
			c.pass(ctx)
		case coordplan.Leave:
			c.leave(ctx)
		}
	}
	for slot, ref := range c.readers {
		if r := c.plan.Readers[slot]; r == nil || r.ID != ref.id {
			delete(c.readers, slot) // gone
		}
	}
	c.g.setOwned(c.plan.Owned, c.plan.HandOff)
}

// noteResize logs the changes of the resize a pass read.
func (c *coordinator) noteResize(prev, r leasestore.Resize) {
	c.g.setResize(r)
	if prev.State != r.State || prev.Generation != r.Generation {
		c.g.logger.Info("kumi: resize state", "generation", r.Generation, "buckets", r.Buckets, "state", r.State,
			"next_buckets", r.NextBuckets, "cut", r.Cut, "cut_decided", r.CutDecided)
	}
}

// spawn starts the reader a.Reader for the holding a.Lease.
func (c *coordinator) spawn(ctx actor.Context, a coordplan.Action) {
	l := a.Lease
	q, err := overflow.New(overflow.Config{
		Capacity:     c.g.opts.QueueCapacity,
		MaxBytes:     c.g.opts.QueueBytes,
		Budget:       c.g.rt.budget,
		Policy:       c.g.opts.Overflow,
		OnTransition: c.g.queueTransition(l.Slot),
	})
	if err != nil {
		panic(invalid("GroupOptions.QueueCapacity", c.g.opts.QueueCapacity, err.Error())) // validated at StartGroup
	}
	m := resizeTold{epoch: l.Epoch, told: a.Told}
	// The new reader starts after what the slot's readers at its epoch
	// handled, its coordinator's earlier incarnations' included: see
	// reader.resumeAt.
	ref := &readerRef{id: a.Reader, epoch: l.Epoch, queue: q, handled: c.g.marks.at(l.Slot, l.Epoch, c.g.store.Server().Epoch)}
	c.g.logger.Debug("kumi: reader starts", "slot", l.Slot, "generation", l.Generation, "bucket", l.Bucket,
		"buckets", l.Buckets, "epoch", l.Epoch, "ready", l.Ready, "resize", m.told.Resize, "bounded", m.told.Active,
		"bound", m.told.Limit, "proposed", m.told.Proposed, "cut", m.told.Decided, "state", c.plan.Resize.State,
		"serving", c.plan.Resize.Generation, "handled", ref.handled.load())
	ref.resize.Store(&m)
	r := func() actor.Actor {
		// Each incarnation starts from what the coordinator last told
		// (a restarted one, too, from what its predecessor was told), and
		// drains if a drain was asked.
		m := ref.resize.Load()
		return &reader{g: c.g, bucket: l.Slot, generation: l.Generation, genBucket: l.Bucket, size: l.Buckets,
			epoch: l.Epoch, fence: c.g.leases.Fence(l.Slot, l.Epoch), queue: q, told: *m,
			handled: ref.handled, draining: ref.drain.Load()}
	}
	var mw []actor.MailboxMiddleware
	if c.readerMailbox != nil {
		mw = c.readerMailbox(l)
	}
	props := actor.PropsFromProducer(r, actor.WithMailbox(q.Mailbox(mw...)), actor.WithSupervisor(c.g.handlerSupervisor),
		actor.WithDispatcher(c.g.rt.dispatcher))
	ref.pid = ctx.Spawn(props)
	c.readers[l.Slot] = ref
	c.g.registerQueue(l.Slot, q)
}

// resumeAt sets where the reader starts, its checkpoint loaded: after the
// checkpoint, or after what its predecessors at its epoch in this process
// handled (r.handled), if that is further — and then writes that position
// at once. A reader spawned again for a slot still held at the same epoch
// (its predecessor stopped on an unsure lease, a renewal that ran late,
// and its last checkpoint write failed; or it was restarted or stopped by
// its supervisor) would otherwise deliver again everything acked since
// the last write; so would one spawned by its coordinator restarted by its
// supervisor, the readers stopped with it (the marks outlive the
// coordinator: see handledMarks). Starting after it is safe: the same
// epoch means no other worker held the slot in between (every claim raises
// the epoch, and the coordinator forgets the mark on any pass that does
// not report the slot held at that epoch, see coordplan.ForgetMarks), so nobody else delivered
// beyond the checkpoint; and the events up to the mark were handled —
// acked or dead-lettered — here. Nor does it cross a resize bound: a
// reader never acks beyond its bound, and a cut is never below a bound
// any reader of the slot delivered to (leasestore.Store.ProposeCut); a
// slot drained to the cut is never served again. The write is fenced like
// every other.
func (r *reader) resumeAt(ctx actor.Context, checkpoint int64) {
	if mark := r.handled.load(); mark > checkpoint {
		r.g.logger.Debug("kumi: reader resumes after what its predecessor handled", "slot", r.bucket, "epoch", r.epoch,
			"checkpoint", checkpoint, "handled", mark)
	}
	r.cpDo(ctx, r.cp.Resume(checkpoint, r.handled.load()))
}

// handledThrough is the position through which the reader's events were
// all handled: its acked position or, with a function handler's run in
// flight, the last event of the run its handler finished — the run is the
// window's only slot (runs need MaxInFlight 1), right after what was
// acked. Called as the reader stops, before wcancel: it ends the run
// (so the handler starts no further event) and takes what it finished.
func (r *reader) handledThrough() int64 {
	if ws := r.runInFlight(); ws != nil {
		if o := ws.run.end(); o.done > 0 {
			return max(r.acked(), ws.batch[o.done-1].Position)
		}
	}
	return r.acked()
}

// handOver runs the HandOver of a slot the plan gives (its reader gone);
// handedOver brings its end back.
func (c *coordinator) handOver(ctx actor.Context, bucket int) {
	self, root, leases, timeout, life := ctx.Self(), ctx.ActorSystem().Root, c.g.leases, c.g.opts.DatabaseTimeout, c.g.life
	marks := c.g.marks.unwritten(bucket, c.g.store.Server().Epoch)
	go func() {
		cctx, cancel := context.WithTimeout(life, timeout)
		defer cancel()
		start := time.Now()
		c.writeMarks(cctx, marks)
		err := leases.HandOver(cctx, bucket)
		root.Send(self, &handedOver{bucket: bucket, start: start, err: err})
	}()
}

// leave releases every lease and leaves the pool, the readers all
// drained (see coordplan.State.BeginLeave), after checkpointing the
// handled marks their readers could not write; groupLeft ends the group.
func (c *coordinator) leave(ctx actor.Context) {
	self, root, leases, timeout, life := ctx.Self(), ctx.ActorSystem().Root, c.g.leases, c.g.opts.DatabaseTimeout, c.g.life
	marks := c.g.marks.unwritten(-1, c.g.store.Server().Epoch)
	go func() {
		cctx, cancel := context.WithTimeout(life, timeout)
		defer cancel()
		c.writeMarks(cctx, marks)
		root.Send(self, &groupLeft{err: leases.Leave(cctx)})
	}()
	c.cancel()
}

// onStopping ends the group when the coordinator's guardian stops it on a
// failure nothing restarts. Once every reader has stopped, it releases the
// leases (best effort) so that healthy workers take the buckets over at
// once; if the readers have not stopped within the handler timeout — a
// handler blocked in a call that ignores its context holds its reader —
// it leaves them behind and the leases to expire. Either way it says what
// went wrong and how to fix it, and closes Done with the error. A stop that
// was asked for (Stop, Abort) is finished by its caller.
func (c *coordinator) onStopping() {
	failure := c.g.failed()
	if failure == nil {
		return
	}
	g, stopped := c.g, c.stopped
	for b, l := range c.plan.Owned {
		g.telemetry.ownership(context.Background(), observability.ChangeRelease, b, l.Epoch, "", "group failed", "", nil)
	}
	c.plan.Owned = map[int]leasestore.Lease{}
	g.setOwned(c.plan.Owned, nil)
	go func() {
		wait := time.NewTimer(g.opts.HandlerTimeout)
		defer wait.Stop()
		released, err := false, error(nil)
		select {
		case <-stopped:
			ctx, cancel := context.WithTimeout(g.life, g.opts.DatabaseTimeout)
			err = g.leases.Leave(ctx)
			cancel()
			released = err == nil
		case <-wait.C:
			err = errors.New("the readers did not stop within the handler timeout (a handler blocked in a call " +
				"that ignores its context?): left running, leases left to expire")
		}
		g.logger.Error("kumi: group stopped: "+failure.Fix, "class", failure.Class.String(), "err", failure.Err,
			"leases_released", released, "release_err", err)
		g.finish(failure)
	}()
}
