package actors

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

type (
	passTick struct{}
	passDone struct {
		// gen is the coordinator incarnation whose pass it is: a pass
		// that ends between a failure and the restart posts its result
		// to the restarted incarnation (same PID), which ignores it.
		gen   *coordinator
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
	// messages.
	readerGone struct{ pid *actor.PID }
	// inspectCoordinator runs on the coordinator's goroutine with the
	// coordinator: the tests' failure reports find its readers through it
	// (see diagnose_test.go).
	inspectCoordinator func(*coordinator)
)

type readerRef struct {
	pid      *actor.PID
	epoch    int64
	queue    *overflow.Queue
	draining bool
	stopping bool
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
// keeps failing across such stops still uses up its retry budget.
type leftRetry struct {
	pos           int64
	attempt, free int
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
type coordinator struct {
	g       *group
	readers map[int]*readerRef
	owned   map[int]leasestore.Lease
	handoff map[int]bool
	passing bool
	again   bool
	leaving bool
	left    bool
	halted  bool         // stopping or restarting
	giving  map[int]bool // HandOver calls under way
	// drained is, by slot, the epoch at which the old-generation slot's
	// reader drained it to the cut: that holding ended for good (a pass
	// that began before the drain may still report it held). The slot is
	// known by its epoch, not by the timing of passes: a cancel frees a
	// drained slot, and a pass after it may claim it again — at a new
	// epoch, a holding to serve — before any pass reported it gone.
	drained map[int]int64
	// resize is the subscription's generation and resize as the last
	// pass read them.
	resize leasestore.Resize
	cancel context.CancelFunc
	bg     context.Context
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
		c.onDrained(ctx, msg)
	case *handedOver:
		delete(c.giving, msg.bucket)
		c.g.telemetry.lease(context.Background(), observability.LeaseHandoffGive, msg.start, msg.err)
		if msg.err != nil {
			c.g.logger.Warn("kumi: handoff failed; the next pass retries", "bucket", msg.bucket, "err", msg.err)
		} else {
			c.g.telemetry.ownership(context.Background(), observability.ChangeHandoffGive, msg.bucket, c.owned[msg.bucket].Epoch, "", "drained for a claimant", "", nil)
			delete(c.owned, msg.bucket)
		}
		delete(c.handoff, msg.bucket)
		c.g.setOwned(c.owned, c.handoff)
		c.pass(ctx)
		c.maybeLeave(ctx)
	case *readerLostFence:
		c.forgetLost(msg.Bucket, msg.Epoch, msg.Err)
		c.pass(ctx)
	case *readerProgress:
		c.g.setProgress(msg.Bucket, msg.Position)
	case *readerCutDrained:
		c.onCutDrained(ctx, msg)
	case *actor.Terminated:
		// A system message: it overtakes the reader's last messages, still
		// queued (readerCutDrained, readerLostFence, readerDrained). Acted
		// on at once, the slot still owned at the reader's epoch, a reader
		// was spawned again for a slot just drained to the cut or lost.
		// Act on it behind them; meanwhile the reader counts as stopping,
		// so nothing is asked of it and no other takes its place.
		for _, ref := range c.readers {
			if ref.pid.Equal(msg.Who) {
				ref.stopping = true
			}
		}
		ctx.Send(ctx.Self(), &readerGone{pid: msg.Who})
	case *readerGone:
		c.onReaderGone(ctx, msg.pid)
	case inspectCoordinator:
		msg(c)
	case stopGroup:
		c.beginLeave(ctx)
	case *groupLeft:
		c.g.finish(msg.err)
		ctx.Stop(ctx.Self())
	}
}

// onReaderGone forgets a reader that stopped, once the coordinator has
// read its last messages, and brings the readers in line. What it handled
// stays in the slot's mark, for the slot's next reader at its epoch (see
// handledMarks).
func (c *coordinator) onReaderGone(ctx actor.Context, pid *actor.PID) {
	for b, ref := range c.readers {
		if ref.pid.Equal(pid) {
			delete(c.readers, b)
		}
	}
	c.syncReaders(ctx)
	c.maybeLeave(ctx)
}

// forgetLost forgets a slot whose reader, at epoch, stopped on a lost or
// unsure lease: no reader is spawned for it until a pass reports it held.
// A reader of an older epoch (one that had not yet stopped when the slot
// was claimed again) says nothing of the lease held now.
func (c *coordinator) forgetLost(slot int, epoch int64, err error) {
	if l, ok := c.owned[slot]; ok && l.Epoch == epoch {
		c.g.logger.Info("kumi: reader stopped on a lost or unsure lease", "bucket", slot, "epoch", l.Epoch, "err", err)
		delete(c.owned, slot)
		c.g.setOwned(c.owned, c.handoff)
	}
}

// halt is the first step of a stop or a restart: the readers stop with the
// coordinator, and none may be spawned again meanwhile.
func (c *coordinator) halt() {
	c.halted = true
	if c.cancel != nil {
		c.cancel()
	}
}

func (c *coordinator) start(ctx actor.Context) {
	c.readers, c.owned, c.handoff, c.giving = map[int]*readerRef{}, map[int]leasestore.Lease{}, map[int]bool{}, map[int]bool{}
	c.drained = map[int]int64{}
	c.bg, c.cancel = context.WithCancel(c.g.life)
	c.stopped = make(chan struct{})
	self, root, bg := ctx.Self(), ctx.ActorSystem().Root, c.bg
	changes := c.g.leases.Changes()
	go func() {
		t := time.NewTicker(c.g.interval)
		defer t.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case <-t.C:
			case <-changes:
			}
			root.Send(self, passTick{})
		}
	}()
	go c.g.measureLags(bg)
	c.pass(ctx)
}

// pass runs one reconcile pass off the mailbox; ticks during a pass are
// folded into one more pass after it.
func (c *coordinator) pass(ctx actor.Context) {
	if c.leaving || c.halted {
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
		done := &passDone{gen: c, res: res, err: err, ctx: sctx, span: span, start: start, dur: time.Since(start)}
		if bg.Err() == nil {
			root.Send(self, done)
		} else {
			span.End(observability.PassSummary{Err: bg.Err()})
		}
	}()
}

func (c *coordinator) onPass(ctx actor.Context, p *passDone) {
	if p.gen != c {
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
		p.span.End(observability.PassSummary{Owned: len(c.owned), Err: p.err})
		c.g.passFailed(p.err)
		c.g.logger.Warn("kumi: reconcile pass failed; keeping the current readers", "err", p.err)
		return
	}
	c.checkLate(p)
	res := p.res
	summary := c.g.telemetry.passChanges(p.ctx, res, c.owned, c.handoff)
	p.span.End(summary)
	if c.leaving {
		return
	}
	owned := map[int]leasestore.Lease{}
	reported := map[int]bool{}
	for _, l := range res.Owned {
		if e, ok := c.drained[l.Slot]; ok && e == l.Epoch {
			reported[l.Slot] = true // the drained holding, reported by a pass that began before the drain
			continue
		}
		owned[l.Slot] = l
	}
	for s := range c.drained {
		if !reported[s] {
			delete(c.drained, s) // gone, or held again at a new epoch
		}
	}
	c.owned = owned
	c.forgetMarks(res)
	c.noteResize(res.Resize)
	for _, b := range res.HandOff {
		c.handoff[b] = true
	}
	for b := range c.handoff {
		if _, ok := owned[b]; !ok {
			delete(c.handoff, b)
		}
	}
	c.g.setOwned(c.owned, c.handoff)
	c.g.setPass(res, p.start)
	c.syncReaders(ctx)
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

// syncReaders brings the reader children in line with what is owned:
// stop readers of buckets lost (or held at another epoch), drain readers of
// buckets being handed off, spawn readers for owned buckets without one.
func (c *coordinator) syncReaders(ctx actor.Context) {
	if c.halted {
		return
	}
	for b, ref := range c.readers {
		l, ok := c.owned[b]
		if (!ok || l.Epoch != ref.epoch) && !ref.stopping && !ref.draining {
			ref.stopping = true
			ctx.Stop(ref.pid)
		}
	}
	for b := range c.handoff {
		ref := c.readers[b]
		switch {
		case ref == nil:
			c.handOver(ctx, b)
		case !ref.draining && !ref.stopping:
			ref.draining = true
			ref.drain.Store(true)
			ctx.Send(ref.pid, &drainReader{})
		}
	}
	if c.leaving {
		return
	}
	buckets := make([]int, 0, len(c.owned))
	for b := range c.owned {
		buckets = append(buckets, b)
	}
	sort.Ints(buckets)
	for _, b := range buckets {
		l := c.owned[b]
		switch ref := c.readers[b]; {
		case ref == nil && !c.handoff[b] && l.Ready:
			c.spawn(ctx, l) // a next generation's bucket waits, held, until ready
		case ref != nil && !ref.stopping && ref.epoch == l.Epoch:
			// Level-triggered: the whole desired state, on every pass and
			// whenever it changes; a reader that missed a message converges
			// at the next. A draining reader (a handoff) proposes too: it
			// holds the lease until it hands over.
			m := c.resizeOf(l)
			ref.resize.Store(&m)
			ctx.Send(ref.pid, &m)
		}
	}
}

func (c *coordinator) spawn(ctx actor.Context, l leasestore.Lease) {
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
	m := c.resizeOf(l)
	// The new reader starts after what the slot's readers at its epoch
	// handled, its coordinator's earlier incarnations' included: see
	// reader.resumeAt.
	ref := &readerRef{epoch: l.Epoch, queue: q, handled: c.g.marks.at(l.Slot, l.Epoch, c.g.store.Server().Epoch)}
	c.g.logger.Debug("kumi: reader starts", "slot", l.Slot, "generation", l.Generation, "bucket", l.Bucket,
		"buckets", l.Buckets, "epoch", l.Epoch, "ready", l.Ready, "resize", m.told.Resize, "bounded", m.told.Active,
		"bound", m.told.Limit, "proposed", m.told.Proposed, "cut", m.told.Decided, "state", c.resize.State,
		"serving", c.resize.Generation, "handled", ref.handled.load())
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

// forgetMarks drops the handled mark (see handledMarks) of every slot a
// pass reports not held, held at another epoch, or newly claimed: their
// next reader starts at the checkpoint. (A slot's epoch grows with every
// claim, but a next generation's lease row deleted by a cancelled resize
// and made again starts over: a new claim of it may repeat an epoch seen
// before.) A reader still running at a forgotten mark keeps writing it,
// for nobody.
func (c *coordinator) forgetMarks(res leasestore.PassResult) {
	claimed := map[int]bool{}
	for _, l := range res.Claimed {
		claimed[l.Slot] = true
	}
	c.g.marks.forget(func(slot int, epoch int64) bool {
		l, ok := c.owned[slot]
		return ok && l.Epoch == epoch && !claimed[slot]
	})
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
// not report the slot held at that epoch, see forgetMarks), so nobody else delivered
// beyond the checkpoint; and the events up to the mark were handled —
// acked or dead-lettered — here. Nor does it cross a resize bound: a
// reader never acks beyond its bound, and a cut is never below a bound
// any reader of the slot delivered to (leasestore.Store.ProposeCut); a
// slot drained to the cut is never served again. The write is fenced like
// every other.
func (r *reader) resumeAt(ctx actor.Context, checkpoint int64) {
	from := max(checkpoint, r.handled.load())
	r.acked, r.flushed = from, checkpoint
	if from > checkpoint {
		r.g.logger.Debug("kumi: reader resumes after what its predecessor handled", "slot", r.bucket, "epoch", r.epoch,
			"checkpoint", checkpoint, "handled", from)
		r.flush(ctx, true)
	}
}

// handledThrough is the position through which the reader's events were
// all handled: its acked position or, with a function handler's run in
// flight, the last event of the run its handler finished — the run is the
// window's only slot (runs need MaxInFlight 1), right after what was
// acked. Called as the reader stops, before window.cancel: it ends the run
// (so the handler starts no further event) and takes what it finished.
func (r *reader) handledThrough() int64 {
	if len(r.win.slots) == 1 {
		if s := r.win.slots[0]; s.state == slotSent && s.run != nil {
			if o := s.run.end(); o.done > 0 {
				return max(r.acked, s.batch[o.done-1].Position)
			}
		}
	}
	return r.acked
}

func (c *coordinator) handOver(ctx actor.Context, bucket int) {
	if c.handoff[bucket] && c.readers[bucket] == nil && !c.giving[bucket] && !c.leaving {
		c.giving[bucket] = true
		self, root, leases, timeout, life := ctx.Self(), ctx.ActorSystem().Root, c.g.leases, c.g.opts.DatabaseTimeout, c.g.life
		go func() {
			cctx, cancel := context.WithTimeout(life, timeout)
			defer cancel()
			start := time.Now()
			err := leases.HandOver(cctx, bucket)
			root.Send(self, &handedOver{bucket: bucket, start: start, err: err})
		}()
	}
}

func (c *coordinator) onDrained(ctx actor.Context, d *readerDrained) {
	c.g.setProgress(d.Bucket, d.Position)
	// The reader stops itself; its Terminated (acted on behind this, see
	// readerGone) removes it, and then the bucket is handed over (or,
	// when leaving, released by Leave).
}

// beginLeave is the graceful stop: drain every reader, then release every
// lease and leave the pool, so other workers take over at once.
func (c *coordinator) beginLeave(ctx actor.Context) {
	if c.leaving {
		return
	}
	c.leaving = true
	for _, ref := range c.readers {
		if !ref.draining && !ref.stopping {
			ref.draining = true
			ref.drain.Store(true)
			ctx.Send(ref.pid, &drainReader{})
		}
	}
	c.maybeLeave(ctx)
}

func (c *coordinator) maybeLeave(ctx actor.Context) {
	if !c.leaving || c.left || len(c.readers) > 0 || len(c.giving) > 0 {
		return
	}
	c.left = true
	self, root, leases, timeout, life := ctx.Self(), ctx.ActorSystem().Root, c.g.leases, c.g.opts.DatabaseTimeout, c.g.life
	for b, l := range c.owned {
		c.g.telemetry.ownership(context.Background(), observability.ChangeRelease, b, l.Epoch, "", "graceful stop", "", nil)
	}
	c.owned = map[int]leasestore.Lease{}
	c.g.setOwned(c.owned, nil)
	go func() {
		cctx, cancel := context.WithTimeout(life, timeout)
		defer cancel()
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
	for b, l := range c.owned {
		g.telemetry.ownership(context.Background(), observability.ChangeRelease, b, l.Epoch, "", "group failed", "", nil)
	}
	c.owned = map[int]leasestore.Lease{}
	g.setOwned(c.owned, nil)
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
