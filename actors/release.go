package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/observability"
)

// Releasing a parked stream: the reader's contract 4 to 7
// (docs/design/parking.md). An operator's replay or discard is a request
// on the stream's row; after each lease pass the coordinator reads the
// requests due (one statement per group and pass, none while no reader
// of the group holds a parked stream) and tells every reader the whole
// set (level-triggered: a reader that missed one, or failed a step, finds
// it again at the next pass). A reader releases one stream at a time, of
// those it holds: a fenced ReleaseParked step at Through 0 reads where the
// release stands (done_version), then it reads the stream from there in
// pages (ReadStream) and delivers each event to its handler outside its
// window, one at a time, recording each with a fenced step at the event's
// version — in the handler's transaction under CommitWithCheckpoint
// (commitReleased). The bucket's other streams go on through the window
// meanwhile; the stream's events the feed brings are still done as
// parked.
//
// Its bound is the last event the window took: the stream's events up to
// it were done as parked, and the release owes them; those after it are
// still to be taken, and flow through the window once the row is gone.
// Caught up, the reader stops taking (the hold: nothing beyond the bound
// is taken, see beyondBound), reads the stream again up to the bound,
// waits for the window to finish and the checkpoint to be written
// through it — so that a crash after the end repeats nothing the release
// delivered — and ends with a fenced Done step; then it takes again, the
// stream's next events as any other's. A released event dead-lettered
// again parks the stream there (ParkStream). A drain stops a release at
// its step: done_version says where the next owner goes on. A step whose
// fence fails is a lost lease.

// releasePage is how many of a released stream's events a reader reads per
// query.
const releasePage = 100

type (
	// releasesAsked brings the coordinator the releases due (see
	// askReleases).
	releasesAsked struct {
		rows []eventsource.ParkedStream
		err  error
	}
	// releasesDue tells a reader the releases due, of every bucket: it
	// takes those of its own.
	releasesDue struct{ rows []eventsource.ParkedStream }
	// releaseDone answers a release's store call: a step (row), a page
	// read (events), a park again (parked).
	releaseDone struct {
		inc    *reader
		rel    *release
		row    *eventsource.ParkedStream
		events []eventsource.RecordedEvent
		parked bool
		err    error
	}
	// releaseWake runs the release after a retry's wait.
	releaseWake struct{ inc *reader }
)

// releasePhase is what a release waits for.
type releasePhase uint8

const (
	relIdle    releasePhase = iota // nothing: the next step is the reader's (advanceRelease)
	relStoring                     // a store call is out (a step, a read, a park)
	relSent                        // its event is with the handler
	relWaiting                     // its event waits out a retry's backoff
)

// release is a reader's release of one parked stream.
type release struct {
	stream string
	action eventsource.ParkAction
	phase  releasePhase
	// done is the row's done_version; page the stream's events read after
	// it, not yet delivered; caughtUp: no event of the stream up to the
	// bound lies beyond page.
	done     int64
	page     []eventsource.RecordedEvent
	caughtUp bool
	// hold is the bound once caught up: the reader takes no event beyond
	// it until the release ends; 0 before.
	hold int64
	// ending: the Done step is out.
	ending bool
	// The delivery out, or the next one's attempt and when it may go.
	d       *Delivery
	span    observability.DeliverySpan
	cancel  context.CancelFunc
	sentAt  time.Time
	attempt int
	wakeAt  time.Time
}

// parkedStep is what a released event's delivery carries for
// CommitWithCheckpoint: its step goes in the handler's transaction.
type parkedStep struct{ buckets, bucket int }

// parkedHolds counts, by slot, the parked streams the group's readers
// hold: the coordinator reads the requests only when some reader holds
// one. asking: a read of the requests is out.
type parkedHolds struct {
	mu     sync.Mutex
	bySlot map[int]parkedHold
	asking bool
}

type parkedHold struct {
	by *reader
	n  int
}

// note records that r holds n parked streams.
func (h *parkedHolds) note(r *reader, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bySlot == nil {
		h.bySlot = map[int]parkedHold{}
	}
	if n == 0 {
		delete(h.bySlot, r.bucket)
		return
	}
	h.bySlot[r.bucket] = parkedHold{by: r, n: n}
}

// forget drops r's count, unless a successor's replaced it.
func (h *parkedHolds) forget(r *reader) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p, ok := h.bySlot[r.bucket]; ok && p.by == r {
		delete(h.bySlot, r.bucket)
	}
}

// startAsking reports whether a read of the requests is due: some reader
// holds a parked stream and no read is out; it marks one out.
func (h *parkedHolds) startAsking() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.asking || len(h.bySlot) == 0 {
		return false
	}
	h.asking = true
	return true
}

// held is how many parked streams slot's reader holds.
func (h *parkedHolds) held(slot int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bySlot[slot].n
}

func (h *parkedHolds) doneAsking() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.asking = false
}

// askReleases reads, after a lease pass, the releases an operator asked
// for, for the readers to carry out (see releasesDue).
func (c *coordinator) askReleases(ctx actor.Context) {
	if c.g.opts.OnDeadLetter != ParkStream || !c.g.parkedHolds.startAsking() {
		return
	}
	self, root, bg, g := ctx.Self(), ctx.ActorSystem().Root, c.bg, c.g
	go func() {
		cctx, cancel := context.WithTimeout(bg, g.opts.DatabaseTimeout)
		defer cancel()
		rows, err := g.store.ParkedStreams(cctx, g.opts.Subscription, eventsource.ParkedFilter{Requested: true, Limit: parkedPage})
		root.Send(self, &releasesAsked{rows: rows, err: err})
	}()
}

// onReleasesAsked tells every reader the releases due.
func (c *coordinator) onReleasesAsked(ctx actor.Context, m *releasesAsked) {
	c.g.parkedHolds.doneAsking()
	if m.err != nil {
		c.g.logger.Warn("kumi: reading the parked streams' releases failed; the next pass reads them again", "err", m.err)
		return
	}
	due := &releasesDue{rows: m.rows}
	for _, ref := range c.readers {
		ctx.Send(ref.pid, due)
	}
}

// noteParkedHeld records how many parked streams the reader holds.
func (r *reader) noteParkedHeld() {
	if r.parked != nil {
		r.g.parkedHolds.note(r, len(r.parked))
	}
}

// onReleasesDue takes the releases due of the reader's bucket.
func (r *reader) onReleasesDue(m *releasesDue) {
	if r.parked == nil {
		return
	}
	r.due = r.due[:0]
	for _, p := range m.rows {
		if eventsource.BucketOfHash(p.Hash, r.size) != r.genBucket {
			continue
		}
		if _, held := r.parked[p.Stream]; held && (p.Action == eventsource.ParkReplay || p.Action == eventsource.ParkDiscard) {
			r.due = append(r.due, p)
		}
	}
}

// releaseHolds reports whether a release holds the event at pos back:
// caught up, it takes nothing beyond its bound until it ends.
func (r *reader) releaseHolds(pos int64) bool {
	return r.rel != nil && r.rel.hold > 0 && pos > r.rel.hold
}

// lastTaken is the position of the last event the window took: of the
// last it holds, or, holding none, the acked position.
func (r *reader) lastTaken() int64 {
	if n := len(r.ws.held); n > 0 {
		return r.ws.held[n-1].Position
	}
	return r.cp.Acked()
}

// releaseBound is the position through which the release delivers.
func (r *reader) releaseBound() int64 {
	if r.rel.hold > 0 {
		return r.rel.hold
	}
	return r.lastTaken()
}

// advanceRelease takes the reader's release its next step, after every
// message: it starts one that is due, and goes on with one whose last
// step is done. A drain, or an unsure lease, stops it where it is.
func (r *reader) advanceRelease(ctx actor.Context) {
	if r.stopped || r.parked == nil || r.cp == nil || r.ws.st == nil || !r.loaded() {
		return
	}
	rel := r.rel
	if rel != nil && (r.draining || r.unsure != nil) {
		r.endRelease(ctx, "the reader drains")
		return
	}
	if rel == nil {
		r.startRelease(ctx)
		return
	}
	switch rel.phase {
	case relSent:
		if time.Since(rel.sentAt) > r.g.opts.HandlerTimeout {
			r.releaseAnswered(ctx, classifyAnswer(nil, errHandlerTimeout, r.g.opts.HandlerTimeout))
		}
		return
	case relWaiting:
		if time.Now().Before(rel.wakeAt) {
			return
		}
		rel.phase = relIdle
	case relStoring:
		return
	}
	bound := r.releaseBound()
	for len(rel.page) > 0 && rel.page[0].Version <= rel.done {
		rel.page = rel.page[1:] // done already (a step in the handler's transaction)
	}
	switch {
	case len(rel.page) > 0 && (rel.page[0].Position == 0 || rel.page[0].Position > bound):
		rel.page, rel.caughtUp = nil, true // beyond the bound: still to come through the window
		r.advanceRelease(ctx)
	case len(rel.page) > 0:
		r.sendReleased(ctx)
	case !rel.caughtUp:
		r.readReleased(ctx)
	case rel.hold == 0:
		// Caught up: hold the take at the bound, and read up to it again.
		rel.hold, rel.caughtUp = max(r.lastTaken(), 1), false
		r.readReleased(ctx)
	case r.cp.Acked() < rel.hold:
		// The window's events up to the bound are not all finished.
	case r.cp.Flushed() < rel.hold:
		r.cpDo(ctx, r.cp.Tick()) // written through the bound, a crash repeats nothing released
	default:
		rel.ending = true
		r.releaseStep(ctx, rel, eventsource.ParkedRelease{Through: rel.done, Done: true})
	}
}

// startRelease starts the first release due of a stream the reader holds.
func (r *reader) startRelease(ctx actor.Context) {
	if r.draining || r.unsure != nil || len(r.due) == 0 {
		return
	}
	p := r.due[0]
	if _, held := r.parked[p.Stream]; !held {
		r.due = r.due[1:]
		return
	}
	r.parked[p.Stream] = p.Action
	r.rel = &release{stream: p.Stream, action: p.Action}
	r.g.logger.Info("kumi: releasing a parked stream", "bucket", r.bucket, "stream", p.Stream, "action", string(p.Action),
		"done_version", p.DoneVersion)
	r.releaseStep(ctx, r.rel, eventsource.ParkedRelease{Through: 0}) // where it stands, fenced
}

// releaseStep writes a step of rel, fenced.
func (r *reader) releaseStep(ctx actor.Context, rel *release, step eventsource.ParkedRelease) {
	step.Subscription, step.Stream, step.Buckets, step.Bucket, step.Fence = r.g.opts.Subscription, rel.stream, r.size, r.genBucket, r.fence
	rel.phase = relStoring
	r.async(ctx, func(c context.Context) any {
		row, err := r.g.store.ReleaseParked(c, nil, step)
		return &releaseDone{inc: r, rel: rel, row: &row, err: err}
	})
}

// readReleased reads the released stream's next page.
func (r *reader) readReleased(ctx actor.Context) {
	rel := r.rel
	rel.phase = relStoring
	from := rel.done + 1
	r.async(ctx, func(c context.Context) any {
		evs, err := r.g.store.ReadStream(c, rel.stream, from, releasePage)
		return &releaseDone{inc: r, rel: rel, events: evs, err: err}
	})
}

// sendReleased delivers the release's next event, outside the window.
func (r *reader) sendReleased(ctx actor.Context) {
	if !r.handlerReady() {
		return // a handler being replaced or probed: its successor gets it
	}
	rel := r.rel
	d := &Delivery{Event: rel.page[0], Attempt: rel.attempt, Subscription: r.g.opts.Subscription, Generation: r.generation,
		Bucket: r.genBucket, Epoch: r.epoch, Fence: r.fence, id: answerIDs.Add(1), exclusive: r.g.opts.MaxInFlight == 1,
		replyTo: ctx.Self(), release: &parkedStep{buckets: r.size, bucket: r.genBucket}}
	c, span := r.g.telemetry.startDelivery(context.Background(), d)
	d.Context, rel.cancel = context.WithCancel(c)
	rel.d, rel.span, rel.sentAt, rel.phase = d, span, time.Now(), relSent
	ctx.Request(r.handler, d)
}

// onReleaseAnswer takes a handler's answer to a released event; it reports
// whether m was one.
func (r *reader) onReleaseAnswer(ctx actor.Context, m *handlerReply) bool {
	rel := r.rel
	if rel == nil || rel.d == nil || m.id != rel.d.id {
		return false
	}
	if m.attempt == rel.d.Attempt && rel.phase == relSent && !r.stopped {
		r.releaseAnswered(ctx, classifyAnswer(m.msg, nil, r.g.opts.HandlerTimeout))
	}
	return true
}

// releaseAnswered acts on the answer a to the released event in hand:
// acked, it is recorded (unless the handler's transaction did) and the
// next goes; dead-lettered, at once or once its retry budget is spent,
// it parks the stream again there; else it is sent again after its
// backoff.
func (r *reader) releaseAnswered(ctx actor.Context, a replyMeaning) {
	rel := r.rel
	d := rel.d
	rel.cancel()
	rel.d, rel.cancel = nil, nil
	if a.warn != "" {
		r.warnAnswer(a.warn, d, nil)
	}
	dead, wait, why := a.outcome == observability.OutcomeDeadLetter, time.Duration(0), a.reason
	if a.outcome != observability.OutcomeAck && !dead {
		dead, wait, why = retryVerdict(r.g.opts.Retry, d.Attempt, 0, a.after, a.reason)
	}
	switch {
	case a.outcome == observability.OutcomeAck:
		rel.span.End(observability.OutcomeAck, nil)
		rel.attempt = 0
		if a.committed {
			rel.done, rel.page, rel.phase = d.Event.Version, rel.page[1:], relIdle
			return
		}
		r.releaseStep(ctx, rel, eventsource.ParkedRelease{Through: d.Event.Version})
	case dead:
		rel.span.End(observability.OutcomeDeadLetter, errors.New(why))
		dl := eventsource.DeadLetter{Subscription: r.g.opts.Subscription, Generation: r.generation, Bucket: r.genBucket,
			EventID: d.Event.ID, Position: d.Event.Position, Stream: d.Event.Stream, Reason: why, Attempts: d.Attempt + 1}
		rel.phase = relStoring
		fence := r.fence
		r.async(ctx, func(c context.Context) any {
			row, err := r.g.store.ParkStream(c, dl, fence)
			return &releaseDone{inc: r, rel: rel, row: &row, parked: true, err: err}
		})
	default:
		if a.outcome == observability.OutcomePanic {
			rel.span.EndPanic(a.reason, nil)
		} else {
			rel.span.End(a.outcome, errors.New(a.reason))
		}
		rel.attempt, rel.phase, rel.wakeAt = d.Attempt+1, relWaiting, time.Now().Add(wait)
		r.after(ctx, wait, &releaseWake{inc: r})
	}
}

// onReleaseDone takes a release's store call.
func (r *reader) onReleaseDone(ctx actor.Context, m *releaseDone) {
	rel := m.rel
	if r.stopped || rel != r.rel || rel.phase != relStoring {
		return // a release stopped meanwhile
	}
	rel.phase = relIdle
	switch {
	case errors.Is(m.err, eventsource.ErrFenceLost):
		r.lostFence(ctx, m.err) // fenced as a checkpoint is: the bucket is another's
		r.endRelease(ctx, "its fence failed")
	case m.err != nil && errors.Is(m.err, eventsource.ErrNotParked) && !m.parked:
		// The row is gone: nothing of the stream is owed any more.
		delete(r.parked, rel.stream)
		r.noteParkedHeld()
		r.endRelease(ctx, m.err.Error())
	case m.err != nil:
		// Refused (parked again, skipped) or failed: the next pass's
		// requests start it again if it is still due.
		r.g.logger.Warn("kumi: a parked stream's release stopped; the next lease pass starts it again if it is still due",
			"bucket", r.bucket, "stream", rel.stream, "err", m.err)
		r.endRelease(ctx, m.err.Error())
	case m.parked:
		r.parked[rel.stream] = ""
		r.g.telemetry.parking(r.bucket, *m.row, false)
		r.endRelease(ctx, "dead-lettered again: parked there")
	case m.row != nil && rel.ending:
		delete(r.parked, rel.stream)
		r.noteParkedHeld()
		row := *m.row
		row.Action = rel.action
		r.g.telemetry.parking(r.bucket, row, true)
		r.endRelease(ctx, "")
	case m.row != nil:
		rel.done = m.row.DoneVersion
	default:
		rel.page, rel.caughtUp = m.events, len(m.events) < releasePage
	}
}

// endRelease ends the reader's release, why (the log's) if it did not
// finish, and takes again what its hold held back.
func (r *reader) endRelease(ctx actor.Context, why string) {
	rel := r.rel
	if rel == nil {
		return
	}
	if rel.cancel != nil {
		rel.cancel()
		rel.span.End(observability.OutcomeCancelled, nil)
	}
	r.rel = nil
	for i, p := range r.due {
		if p.Stream == rel.stream {
			r.due = append(r.due[:i], r.due[i+1:]...)
			break
		}
	}
	if why != "" {
		r.g.logger.Debug("kumi: a parked stream's release stops", "bucket", r.bucket, "stream", rel.stream, "why", why)
	}
	if rel.hold > 0 && !r.stopped {
		r.pump(ctx)
	}
}

// releasing reports whether a release is under way: the tick keeps
// running for its handler timeout.
func (r *reader) releasing() bool { return r.rel != nil }

// commitReleased is CommitWithCheckpoint for a released event: fn commits
// with the release's step at the event's version, fenced, instead of the
// checkpoint; a step there already returns ErrAlreadyCommitted.
func commitReleased(ctx context.Context, store *eventsource.Store, d *Delivery, fn func(ctx context.Context, tx pgx.Tx) error) error {
	step := eventsource.ParkedRelease{Subscription: d.Subscription, Stream: d.Event.Stream, Buckets: d.release.buckets,
		Bucket: d.release.bucket, Fence: d.Fence}
	return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		row, err := store.ReleaseParked(ctx, tx, step) // fenced; locks the row
		if err != nil {
			return fmt.Errorf("kumi: commit a released event: %w", err)
		}
		if row.DoneVersion >= d.Event.Version {
			return ErrAlreadyCommitted
		}
		if err := fn(ctx, tx); err != nil {
			return err
		}
		step.Through, step.Fence = d.Event.Version, nil
		_, err = store.ReleaseParked(ctx, tx, step)
		return err
	})
}

// commitReleasedBatch is CommitBatchWithCheckpoint for a released event,
// delivered alone (a BatchFunc takes it as a batch of one): fn commits
// with the release's step (see commitReleased).
func commitReleasedBatch(ctx context.Context, store *eventsource.Store, b *Batch,
	fn func(ctx context.Context, tx pgx.Tx, events []eventsource.RecordedEvent) error) error {
	return commitReleased(ctx, store, b.d, func(c context.Context, tx pgx.Tx) error {
		err := fn(c, tx, b.Events)
		if p := (*PartialError)(nil); errors.As(err, &p) && p.Done == len(b.Events) && p.Err == nil {
			return nil // all done after all
		}
		return err // a DoneUpTo(0, err) rolls back: BatchFunc answers err's answer
	})
}

// parking records a stream parked (p.Action "") or its release ended.
func (t *telemetry) parking(bucket int, p eventsource.ParkedStream, released bool) {
	t.t.Parking(context.Background(), observability.ParkingInfo{Subscription: t.subscription, Bucket: bucket,
		Stream: p.Stream, Version: p.DoneVersion, Released: released, Action: string(p.Action), Reason: p.Reason})
}
