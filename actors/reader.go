package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/checkpointing"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/readfeed"
	"github.com/kumi-run/kumi/internal/resizepart"
	"github.com/kumi-run/kumi/observability"
)

// OverflowBatch marks a liveBatch as bounded by the reader's overflow queue.
func (*liveBatch) OverflowBatch() {}

// OverflowBytes is the batch's size for the queue's byte bounds.
func (b *liveBatch) OverflowBytes() int64 { return b.Bytes }

// Messages between a reader, its coordinator and itself. inc, in the
// reader's own, is the incarnation that asked: a reader restarted by its
// supervisor is a new *reader in the same actor, and drops what its
// predecessor's calls answer.
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
		Epoch  int64
		Err    error
	}
	// readerProgress reports a flushed checkpoint.
	readerProgress struct {
		Bucket   int
		Position int64
	}

	checkpointLoaded struct {
		inc *reader
		pos int64
		// parked are the bucket's parked streams, when the group parks
		// (see parking.go).
		parked []eventsource.ParkedStream
		err    error
	}
	pageRead struct {
		inc    *reader
		read   uint64 // the readfeed.Read it answers
		events []eventsource.RecordedEvent
		bytes  int64
		err    error
	}
	flushDone struct {
		inc   *reader
		write uint64 // the checkpointing.Write it answers
		err   error
	}
	deadLettered struct {
		inc *reader
		id  uint64
		// parked is the row of the stream the letter parked (nil unless
		// the group parks).
		parked *eventsource.ParkedStream
		err    error
	}
	redeliver struct {
		inc     *reader
		id      uint64
		attempt int // the window's (see window.State.Redeliver)
	}
	flushTick      struct{ inc *reader }
	respawnHandler struct{ inc *reader }
	// handlerGone follows a handler's Terminated, behind its answers.
	handlerGone struct {
		inc *reader
		pid *actor.PID
	}
	// readAgain and rewriteDeadLetter retry a failed read or dead-letter
	// write in place (see retryInPlace).
	readAgain         struct{ inc *reader }
	rewriteDeadLetter struct {
		inc *reader
		id  uint64
	}
	// inspectReader runs on the reader's goroutine with the reader: the
	// tests' failure reports read its state through it (see
	// diagnose_test.go).
	inspectReader func(*reader)
)

// reader is the BucketReader: one per owned bucket, child of the
// coordinator. It catches up from its checkpoint through SQL, then follows
// the publisher's batches, delivers its events one at a time to its handler
// (so per-stream order holds), and moves the fenced checkpoint after acks.
type reader struct {
	g *group
	// bucket is the reader's entry, the key of its lease and checkpoint
	// (eventsource.Slot(generation, genBucket); in generation 0 the bucket
	// itself); genBucket is its bucket within its generation, of size.
	bucket     int
	generation int
	genBucket  int
	size       int
	epoch      int64
	// server is the store's server epoch the reader started in
	// (eventsource.Store.Server): its positions are that server's, and
	// its fence refuses every write once the store has another (see
	// newEpoch).
	server int64
	fence  eventsource.Fence
	queue  *overflow.Queue
	// part is the reader's part in its slot's resizes (see
	// resize_reader.go and internal/resizepart): it delivers nothing
	// beyond part.Bound(). told is what the coordinator last told when
	// the reader was made, taken at its start.
	part resizepart.Part
	told resizeTold

	handler      *actor.PID // nil while it is being replaced
	replacements int        // handlers replaced in this reader's life
	probe        uint64     // the probe of the handler that is out (see answerIDs), 0 if none
	probeAt      time.Time
	probeFor     lateDelivery
	bg           context.Context
	cancel       context.CancelFunc

	// feed is the read side (internal/readfeed): the cursor, the events
	// read and not yet in the window, the catch-up and the hold of the
	// live queue. The reader carries out its effects (see feedDo).
	feed *readfeed.Feed
	// ws is the delivery window, a state machine (internal/window), and
	// what the reader keeps beside it (see deliver.go).
	ws windowed
	// cp is the checkpoint side (internal/checkpointing): the acked
	// position — how far the window's finished prefix reaches — and the
	// fenced checkpoint writes that follow it, one at a time. The reader
	// carries out its effects (see cpDo).
	cp         *checkpointing.State
	draining   bool
	stopped    bool
	overflowed error
	unsure     error // EnsureHeld failed: the reader drains and stops
	// handled is the slot's mark of what its readers at this epoch
	// handled in this process (see handledMarks): the reader starts after
	// it, and leaves its acked position there when it stops (see
	// resumeAt).
	handled *handledMark
	// carried is the event a predecessor at this epoch left retrying, not
	// yet in the window: its entry goes on with its attempts (see
	// leftRetry).
	carried *leftRetry
	// storeFailures counts transient database failures in a row, retried
	// in place (see retryInPlace).
	storeFailures int
	tick          time.Duration
	// parked are the bucket's parked streams by name, with their
	// operator's action (see parking.go); nil unless the group parks.
	parked map[string]eventsource.ParkAction
	// due are the releases an operator asked for of its parked streams,
	// as the coordinator last told; rel the one under way (release.go).
	due []eventsource.ParkedStream
	rel *release
	// ticking: a flushTick is armed. The tick runs only while there is
	// something for it to do (see tickNeeded): an idle reader arms no
	// timer and gets no message.
	ticking bool
}

func (r *reader) Receive(ctx actor.Context) {
	defer r.keepTicking(ctx)
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		r.start(ctx)
	case *actor.Stopping:
		r.shutdown(ctx)
	case *actor.Stopped:
		// For good (a restart keeps the queue): what the queue holds, and
		// what the publisher posts before it learns, would hold the
		// process's byte budget.
		r.queue.Close()
	case *actor.Restarting:
		r.shutdown(ctx)
	case *checkpointLoaded:
		if msg.inc != r {
			return
		}
		if msg.err != nil {
			panic(fmt.Errorf("kumi: bucket %d: load checkpoint: %w", r.bucket, msg.err))
		}
		r.g.logger.Debug("kumi: reader checkpoint loaded", "slot", r.bucket, "epoch", r.epoch, "checkpoint", msg.pos)
		r.resumeAt(ctx, msg.pos)
		r.loadParked(msg.parked)
		r.carried = r.handled.takeLeft(r.cp.Acked())
		r.feedDo(ctx, r.feed.Loaded(r.cp.Acked(), r.feedEnv())) // reads the first page
		// A checkpoint at a decided cut leaves nothing to read: no page
		// answers, and at the tail no batch comes, to run the drain check
		// (TestAReaderStartedAtTheCutDrains).
		r.pump(ctx)
	case *pageRead:
		if msg.inc == r {
			r.onPage(ctx, msg)
		}
	case *liveBatch:
		r.onLive(ctx, msg)
	case *subscribed:
		r.onSubscribed(ctx, msg)
	case *overflow.PausedSignal:
		r.onPaused(ctx)
	case *overflow.OverflowedSignal:
		// DropSubscription: the queue takes no live batch ever again, so
		// this reader ends with the typed error (see endOverflowed), but
		// first the events in flight are finished and the checkpoint
		// flushed, so that the next reader of the bucket repeats nothing.
		r.overflowed = msg.Err
		r.g.setReaderState(r.bucket, readerOverflowed)
		r.beginDrain(ctx)
	case *redeliver:
		if msg.inc == r {
			r.redeliver(ctx, msg)
		}
	case *deadLettered:
		if msg.inc == r {
			r.onDeadLettered(ctx, msg)
		}
	case *flushDone:
		if msg.inc == r {
			r.onFlushed(ctx, msg)
		}
	case *flushTick:
		if msg.inc == r {
			r.ticking = false // keepTicking arms the next one if there is work for it
			r.cpDo(ctx, r.cp.Tick())
			r.checkTimeouts(ctx)
			r.report()
		}
	case *handlerReply:
		r.onHandlerReply(ctx, msg)
	case *actor.Terminated:
		// A system message: it overtakes the handler's last answers, still
		// queued. Act on it behind them.
		ctx.Send(ctx.Self(), &handlerGone{inc: r, pid: msg.Who})
	case *probeAnswer:
		r.onProbeAnswer(ctx, msg.seq)
	case *handlerGone:
		if msg.inc == r {
			r.onHandlerTerminated(ctx, msg.pid)
		}
	case *readAgain:
		if msg.inc == r && !r.stopped {
			r.feedDo(ctx, r.feed.ReadAgain(r.feedEnv()))
		}
	case *rewriteDeadLetter:
		if msg.inc == r && !r.stopped {
			r.wdo(ctx, r.ws.st.RewriteLetter(msg.id))
		}
	case *respawnHandler:
		if msg.inc == r && !r.stopped && r.handler == nil {
			r.spawnHandler(ctx)
			r.wstep(ctx, r.ws.st.HandlerSpawned())
		}
	case *drainReader:
		r.beginDrain(ctx)
	case inspectReader:
		msg(r)
	case *resizeTold:
		r.onResizeTold(ctx, msg)
	case *releasesDue:
		r.onReleasesDue(msg)
	case *releaseDone:
		if msg.inc == r {
			r.onReleaseDone(ctx, msg)
		}
	case *releaseWake:
	case *proposed:
		if msg.inc == r {
			r.onProposed(ctx, msg)
		}
	case *cutDrained:
		if msg.inc == r {
			r.onCutDrained(ctx, msg)
		}
	case *proposeAgain:
		if msg.inc == r && !r.stopped {
			r.apply(ctx, r.part.Retry())
		}
	case *drainAgain:
		if msg.inc == r && !r.stopped {
			r.apply(ctx, r.part.Retry())
		}
	}
	r.advanceRelease(ctx)
}

func (r *reader) start(ctx actor.Context) {
	r.g.rt.readers.Add(1)
	// Positions are the server's: a mark left on another (before a
	// failover) is not taken, and no write lands once it changes again.
	r.server = r.g.store.Server().Epoch
	if r.handled != nil && r.handled.server != r.server {
		r.handled = r.g.marks.at(r.bucket, r.epoch, r.server)
	}
	r.fence = r.g.store.ServerFence(r.server, r.fence)
	r.bg, r.cancel = context.WithCancel(context.Background())
	r.cp = checkpointing.New(checkpointing.Config{Every: r.g.opts.CheckpointEvery})
	r.feed = readfeed.New(readfeed.Config{BatchSize: r.g.opts.BatchSize})
	r.feedDo(ctx, r.feed.Poll(r.feedEnv())) // holds the queue until the checkpoint is loaded and read through
	// A restart clears a pause the last incarnation left. The queue
	// survives restarts, and one that overflowed under DropSubscription
	// never takes a live batch again: this reader would catch up once and
	// then stall. It ends at once instead, as its predecessor would have.
	if err := r.queue.Resume(); err != nil {
		r.endOverflowed(err)
	}
	r.wireWindow()
	r.spawnHandler(ctx)
	// What the coordinator last told: started on a decided cut, the
	// catch-up reads through it, even in a bucket with no event near it
	// (no live batch would move the cursor there); started sealing with no
	// proposal, it proposes before anything is delivered (nothing is read
	// yet: frozen at 0, the proposal is the head).
	r.onResizeTold(ctx, &r.told)
	ctx.Send(r.g.publisher, &subscribe{PID: ctx.Self(), Category: r.g.opts.Category, Size: r.size, Bucket: r.genBucket})
	// One timer serves the checkpoint interval and the handler timeout.
	r.tick = min(r.g.opts.CheckpointInterval, max(r.g.opts.HandlerTimeout/4, time.Millisecond))
	r.ticking = true
	r.after(ctx, r.tick, &flushTick{inc: r})
	r.report()
	r.async(ctx, func(c context.Context) any {
		// The index of the reader's generation (a no-op once built: a
		// resize builds the new generation's before it is requested).
		if err := r.g.store.EnsureConsumerGroupIndex(c, r.size); err != nil {
			return &checkpointLoaded{inc: r, err: err}
		}
		parked, err := r.readParked(c)
		if err != nil {
			return &checkpointLoaded{inc: r, err: err}
		}
		pos, err := r.g.store.Checkpoint(c, r.g.opts.Subscription, r.bucket)
		return &checkpointLoaded{inc: r, pos: pos, parked: parked, err: err}
	})
}

func (r *reader) shutdown(ctx actor.Context) {
	if r.stopped {
		return
	}
	r.stopped = true
	r.g.rt.readers.Add(-1)
	if r.loaded() {
		r.handled.leave(r.leftRetry())
	}
	r.handled.note(r.handledThrough())
	if r.cp != nil {
		r.handled.wrote(r.cp.Flushed())
	}
	r.g.setReaderState(r.bucket, "")
	r.unreport()
	r.g.parkedHolds.forget(r)
	r.wcancel()
	if r.handler != nil {
		ctx.Stop(r.handler) // not a child: it does not stop with the reader by itself
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
// keepTicking arms the next flushTick after any message, unless one is
// armed, the reader stopped, or the tick has nothing to do (see
// tickNeeded).
func (r *reader) keepTicking(ctx actor.Context) {
	// A start that panicked before its window was built (endOverflowed)
	// has none: this runs deferred, during the panic, and must not
	// replace the panic's error with its own.
	if r.ticking || r.stopped || r.cp == nil || r.ws.st == nil || !r.tickNeeded() {
		return
	}
	r.ticking = true
	r.after(ctx, r.tick, &flushTick{inc: r})
}

// tickNeeded reports whether the flushTick has work: a checkpoint to
// write or being written, events delivered or pending (their handler
// timeouts, a probe), a catch-up under way — and the reader's report
// to keep fresh meanwhile. An idle reader at the tail, everything
// handled written, needs none: its last report stands until something
// comes (1,600 idle buckets' ticks were 8,000 messages a second).
func (r *reader) tickNeeded() bool {
	return r.cp.Acked() > r.cp.Flushed() || r.cp.Phase() == checkpointing.Writing || r.ws.st.Len() > 0 ||
		r.probe != 0 || r.feed.Phase() != readfeed.Live || len(r.feed.Pending()) > 0 || r.releasing()
}

func (r *reader) after(ctx actor.Context, d time.Duration, msg any) {
	self, root, bg := ctx.Self(), ctx.ActorSystem().Root, r.bg
	time.AfterFunc(d, func() {
		if bg.Err() == nil {
			root.Send(self, msg)
		}
	})
}

// feedEnv is what the read side reads of the world at an input (see
// readfeed.Env).
func (r *reader) feedEnv() readfeed.Env {
	return readfeed.Env{Published: r.g.rt.publishedIn(r.server), ReadAhead: r.readAhead()}
}

// loaded reports whether the reader's checkpoint is loaded.
func (r *reader) loaded() bool { return r.feed != nil && r.feed.Phase() != readfeed.Loading }

// feedDo carries out the read side's effects: the queue's hold, its
// resume after a pause, then a page read (which sees every event of the
// batches the pause dropped: it starts after Resume).
func (r *reader) feedDo(ctx actor.Context, e readfeed.Effects) {
	switch {
	case e.Hold:
		r.queue.Hold()
	case e.Release:
		r.queue.Release()
	}
	if e.Resume {
		if err := r.queue.Resume(); err != nil {
			panic(err) // only an overflowed queue refuses, and a paused one is not
		}
	}
	if e.Read != nil {
		r.readPage(ctx, *e.Read)
	}
}

// readPage reads the catch-up page the read side asked for.
func (r *reader) readPage(ctx actor.Context, rd readfeed.Read) {
	o := r.g.opts
	r.async(ctx, func(c context.Context) any {
		c, span := r.g.telemetry.startReaderFetch(c, r.bucket, rd.From)
		events, err := r.g.rt.reads.ReadBucketPage(c, o.Category, r.genBucket, r.size, eventsource.Page{After: rd.From, Known: rd.Target, Limit: rd.Limit, MaxBytes: rd.MaxBytes})
		last := rd.From
		if len(events) > 0 {
			last = events[len(events)-1].Position
		}
		span.End(len(events), last, err)
		return &pageRead{inc: r, read: rd.ID, events: events, bytes: readfeed.SizeOf(events), err: err}
	})
}

// readAhead is how many bytes of events the reader reads ahead of its
// handler: QueueBytes, or its share of the process's budget
// (RuntimeOptions.QueueBytes) when that is smaller — so that the readers
// of a worker holding many buckets together read ahead about the budget —
// but at least MinQueueBytes.
func (r *reader) readAhead() int64 {
	share := r.g.rt.budget.Limit() / max(r.g.rt.readers.Load(), 1)
	return max(min(r.g.opts.QueueBytes, share), MinQueueBytes)
}

func (r *reader) onPage(ctx actor.Context, p *pageRead) {
	if p.err != nil {
		err := fmt.Errorf("kumi: bucket %d: catch-up read: %w", r.bucket, p.err)
		if r.retryInPlace(ctx, err, &readAgain{inc: r}) {
			return // still reading: readAgain reads the page again
		}
		panic(err)
	}
	r.storeFailures = 0
	r.feedDo(ctx, r.feed.Page(readfeed.Page{Read: p.read, Events: p.events, Bytes: p.bytes}, r.feedEnv()))
	r.pump(ctx)
}

// onPaused follows internal/overflow's protocol after a pause (see
// readfeed.Feed.Paused): the queue is held, resumed, and the bucket read
// again from the cursor through the tail.
func (r *reader) onPaused(ctx actor.Context) {
	r.feedDo(ctx, r.feed.Paused(r.feedEnv()))
}

// onSubscribed makes the catch-up read through the position the reader's
// subscription starts at (see readfeed.Feed.Subscribed).
func (r *reader) onSubscribed(ctx actor.Context, m *subscribed) {
	if r.otherEpoch(m.Epoch) {
		return
	}
	r.feedDo(ctx, r.feed.Subscribed(m.From, r.feedEnv()))
}

func (r *reader) onLive(ctx actor.Context, b *liveBatch) {
	if r.otherEpoch(b.Epoch) {
		return
	}
	r.feedDo(ctx, r.feed.Live(readfeed.Batch{From: b.From, To: b.To, Events: b.Events}, r.feedEnv()))
	r.pump(ctx)
}

// otherEpoch reports whether what the publisher told in server epoch
// epoch is of another epoch than the reader's: positions of another
// server mean nothing on the reader's. A later one starts the reader's
// new epoch (see newEpoch); an earlier one is left (the publisher tells
// every reader again once it has the new server's head).
func (r *reader) otherEpoch(epoch int64) bool {
	if epoch > r.server && r.unsure == nil { // an unsure reader stops anyway: its successor starts in the new epoch
		r.newEpoch(&eventsource.ServerChangedError{Epoch: r.server, Now: epoch, Server: r.g.store.Server().Identity})
	}
	return epoch != r.server
}

// newEpoch ends the reader's server epoch: the store found another server
// (a failover: a promoted standby may lack the last commits and hand their
// positions out again, to other events), so the reader's cursor, what it
// read and its handled mark mean nothing there. It fails, and its
// supervisor restarts it: the next incarnation starts from the checkpoint
// stored on the new server, with a mark of its own (see reader.start).
// The events in flight may be delivered again: at least once.
func (r *reader) newEpoch(err error) {
	panic(fmt.Errorf("kumi: bucket %d: starting again from the stored checkpoint: %w", r.bucket, err))
}

// Reader states shown in the group's status (observability's /status) in
// place of "reading".
const (
	readerOverflowed       = "overflowed"        // DropSubscription: draining, then a new reader starts
	readerReplacingHandler = "replacing_handler" // the handler stopped or hung; its successor starts after a backoff
)

// setReaderState records a bucket's reader state for the status; "" is the
// ordinary state.
func (g *group) setReaderState(bucket int, state string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if state == "" {
		delete(g.readerStates, bucket)
		return
	}
	if g.readerStates == nil {
		g.readerStates = map[int]string{}
	}
	g.readerStates[bucket] = state
}

// readerReport is what one reader last reported of itself.
type readerReport struct {
	by *reader
	st observability.ReaderStatus
}

// report records where the reader stands for the status (see
// observability.ReaderStatus): at its start and at every tick, so that a
// bucket that does not move says why.
func (r *reader) report() {
	b := r.part.Bound()
	pending := r.feed.Pending()
	st := observability.ReaderStatus{Cursor: r.feed.Cursor(), Acked: r.acked(), Pending: len(pending), InFlight: r.inFlight(),
		CatchingUp: r.feed.Phase() != readfeed.Live, Bounded: b.Bounded, Bound: b.Limit, CutDecided: b.Decided,
		Proposing: r.part.Phase() == resizepart.Proposing, Draining: r.draining || r.unsure != nil, HandlerReady: r.handlerReady(), At: time.Now()}
	if len(pending) > 0 {
		st.NextPending = pending[0].Position
	}
	g := r.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reports == nil {
		g.reports = map[int]readerReport{}
	}
	g.reports[r.bucket] = readerReport{by: r, st: st}
}

// unreport removes the reader's report, unless a successor's replaced it.
func (r *reader) unreport() {
	g := r.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if rep, ok := g.reports[r.bucket]; ok && rep.by == r {
		delete(g.reports, r.bucket)
	}
}

// OverflowError ends a bucket's reader whose queue overflowed under the
// DropSubscription policy; it wraps ErrOverflowed. An application learns of
// it from the supervision observer (RuntimeOptions.Supervision): the
// reader's stop decision carries it as its Reason, recognised with
// errors.Is(decision.Reason, ErrOverflowed) or errors.As.
type OverflowError = overflow.OverflowError

// ErrOverflowed is wrapped by every *OverflowError.
var ErrOverflowed = overflow.ErrOverflowed

// endOverflowed ends the reader with the queue's *overflow.OverflowError:
// under DropSubscription a bucket's subscription is dropped when its queue
// overflows. The error is permanent for supervision, which stops the
// reader (the supervision observer sees the decision, with the error); the
// coordinator then starts a new reader for the bucket, with a new queue,
// from the checkpoint. Nothing is lost, and what this reader acked is
// flushed first (see maybeFinishDrain).
func (r *reader) endOverflowed(err error) {
	r.g.logger.Warn("kumi: reader queue overflowed under drop_subscription; the bucket's subscription is dropped and a new reader resumes from its checkpoint",
		"bucket", r.bucket, "err", err)
	panic(err) // permanent: supervision stops the reader
}

// leftRetry is the event of the window's first slot — the first after the
// acked position — if it was delivered and not finished (window.State.Left,
// and LeftRun with a run in flight): one waiting to be
// sent again (its backoff, a replaced handler, or the lease found unsure
// before it went), with its attempts; or one with the handler as the
// reader stops at once (a restart, or a stop by its coordinator) — of a
// function handler's run, the event in hand, ended here (see run.end) —
// whose attempt is given up, not charged to its budget: it was not the
// event's fault; or one whose dead letter was being written, with the
// letter, for the successor to write again. Else the one carried from a
// predecessor and not yet taken into the window; nil if none.
func (r *reader) leftRetry() *leftRetry { return r.wleft() }

// wrote records the checkpoint a stopping reader wrote.
func (h *handledMark) wrote(pos int64) {
	if h != nil {
		h.written.Store(pos)
	}
}

// leave records the event a stopping reader leaves retrying (nil: none).
func (h *handledMark) leave(l *leftRetry) {
	if h != nil {
		h.left.Store(l)
	}
}

// takeLeft is the event a predecessor left retrying, if it lies after from.
func (h *handledMark) takeLeft(from int64) *leftRetry {
	if h == nil {
		return nil
	}
	if l := h.left.Load(); l != nil && l.pos > from {
		return l
	}
	return nil
}
