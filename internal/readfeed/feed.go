package readfeed

import (
	"fmt"

	"github.com/kumi-run/kumi/eventsource"
)

// Phase is what the read side is doing.
type Phase uint8

const (
	// Loading: the checkpoint is not loaded yet. Nothing is read, and
	// live batches are held.
	Loading Phase = iota
	// CatchingUp: the feed reads pages from the store until they cover
	// its target; live batches are held meanwhile, and a batch taken
	// before the hold only raises the target.
	CatchingUp
	// Live: the feed takes the publisher's batches.
	Live
)

// String names the phase as the reader's diagnostics print it.
func (p Phase) String() string {
	switch p {
	case Loading:
		return "loading"
	case CatchingUp:
		return "catching_up"
	case Live:
		return "live"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// Config is what the feed is built with.
type Config struct {
	// BatchSize is the most events a page reads, and the most the feed
	// keeps pending (GroupOptions.BatchSize).
	BatchSize int
}

// Env is what the feed reads of the world at an input: values that
// change while it runs, which it does not own.
type Env struct {
	// Published is the publisher's position in the reader's server epoch
	// (0 if none): everything up to it has been posted in live batches,
	// to the subscribers the publisher had then. A catch-up page covers
	// it.
	Published int64
	// ReadAhead is how many bytes of events the reader reads ahead of its
	// handler: a page reads at most this much, and the feed holds live
	// batches once this much is pending.
	ReadAhead int64
}

// Read is an effect: read a page of the bucket — its events after From,
// at most Limit of them and MaxBytes of them, covering Target (the known
// position of eventsource.PageReader: a page that is not full holds every
// event in (From, Target]) — and answer it with a [Page] naming ID.
type Read struct {
	ID       uint64
	From     int64
	Target   int64
	Limit    int
	MaxBytes int64
}

// Effects are what the actor carries out after an input, in this order:
// hold or release the live queue, resume it, start the read.
type Effects struct {
	Hold, Release bool
	// Resume: resume the paused live queue (after a [Feed.Paused]), before
	// the read starts — a read that starts after Resume sees every event
	// of the batches the pause dropped.
	Resume bool
	// Read, if set, is the page to read now. At most one read is out.
	Read *Read
}

// Page is a read's answer.
type Page struct {
	Read   uint64 // the Read.ID it answers
	Events []eventsource.RecordedEvent
	// Bytes is the events' total eventsource.RecordedEvent.Size (counted
	// off the reader's mailbox).
	Bytes int64
}

// Batch is a live batch of the publisher: every event of the bucket in
// (From, To].
type Batch struct {
	From, To int64
	Events   []eventsource.RecordedEvent
}

// Bound is the reader's resize bound as the feed needs it: a decided cut
// (Decided, Limit) caps the catch-up; a bound lifted (not Bounded) reads
// again from the cursor. A bound that is only proposed changes nothing
// here (the window stops at it).
type Bound struct {
	Bounded, Decided bool
	Limit            int64
}

// read is the read out: what it was started for.
type read struct {
	Read
	resumes uint64 // the queue's resumes when it started
	// want is the target it would have had with no cut: it covered only
	// Target, capped at a decided cut, should the cut be lifted while it
	// was out.
	want int64
}

// Feed is one reader incarnation's read side. The zero value is not
// usable: see [New].
type Feed struct {
	cfg     Config
	phase   Phase
	cursor  int64                       // every event of the bucket up to here is pending or taken
	pending []eventsource.RecordedEvent // read, not yet taken by the window
	bytes   int64                       // pending's size
	target  int64                       // the catch-up covers at least this position
	resumes uint64                      // queue resumes after a pause; a catch-up reads past the last one
	held    bool                        // the live queue is held (as last told)
	out     *read                       // the read out, nil if none
	reads   uint64                      // reads started
	// eventSize is the average size of the events last read (see
	// FetchLimit).
	eventSize int64
	cut       int64 // a decided resize cut (cutDecided): the catch-up reads no page past it
	cutSet    bool
}

// New returns a feed in [Loading].
func New(cfg Config) *Feed {
	return &Feed{cfg: cfg}
}

// Phase returns what the feed is doing.
func (f *Feed) Phase() Phase { return f.phase }

// Cursor is the position up to which every event of the bucket is pending
// or taken.
func (f *Feed) Cursor() int64 { return f.cursor }

// Target is the position the catch-up covers at least.
func (f *Feed) Target() int64 { return f.target }

// Resumes counts the live queue's resumes after a pause.
func (f *Feed) Resumes() uint64 { return f.resumes }

// Reading reports whether a page read is out.
func (f *Feed) Reading() bool { return f.out != nil }

// Held reports whether the live queue is held (as the feed last told).
func (f *Feed) Held() bool { return f.held }

// Pending is the events read and not yet taken, in position order. The
// caller must not change it: it takes events with [Feed.Take].
func (f *Feed) Pending() []eventsource.RecordedEvent { return f.pending }

// PendingBytes is the pending events' total size.
func (f *Feed) PendingBytes() int64 { return f.bytes }

// String is the feed's state in one line, for diagnostics and the
// simulation's trace.
func (f *Feed) String() string {
	out := "none"
	if f.out != nil {
		out = fmt.Sprintf("#%d (%d, %d]", f.out.ID, f.out.From, f.out.Target)
	}
	cut := "none"
	if f.cutSet {
		cut = fmt.Sprint(f.cut)
	}
	return fmt.Sprintf("%s cursor %d target %d resumes %d held %v read %s pending %d (%d bytes) cut %s",
		f.phase, f.cursor, f.target, f.resumes, f.held, out, len(f.pending), f.bytes, cut)
}

// Poll returns what to do now: a read, if the catch-up waits for room in
// the pending list and there is some; a hold or a release, if the live
// queue should change. The actor polls after its window took events.
func (f *Feed) Poll(env Env) Effects {
	var e Effects
	if f.phase == CatchingUp && f.out == nil && f.covered() {
		// A decided cut the cursor reached: nothing beyond it is
		// delivered, so nothing beyond it is read (a bound lifted later
		// reads again from the cursor, see Bound).
		f.phase = Live
	}
	if f.out == nil && !f.full(env) && (f.phase == CatchingUp || (fault == faultReadBeforeLoaded && f.phase == Loading)) {
		e.Read = f.read(env)
	}
	// Live batches stay in the bounded queue — where the overflow policy
	// applies — while the feed catches up or already holds a batch's
	// worth of events; it takes the next batch only when it has room.
	if want := f.phase != Live || f.full(env); want != f.held {
		f.held = want
		e.Hold, e.Release = want, !want
	}
	return e
}

// Loaded starts the read side at from: after the checkpoint, or after
// what the reader's predecessors handled (see the actor's resumeAt). The
// first page is read from here.
func (f *Feed) Loaded(from int64, env Env) Effects {
	if f.phase == Loading {
		f.cursor = from
		f.phase = CatchingUp
	}
	return f.Poll(env)
}

// read starts the next catch-up page: at most BatchSize events and
// ReadAhead bytes, fewer when the events last read were large (see
// FetchLimit). Not before the checkpoint is loaded (see Loading).
func (f *Feed) read(env Env) *Read {
	// The page must cover what the publisher has read, not only the
	// batches this reader got: after a pause dropped some, or before the
	// first, a read on a standby could otherwise end below them and leave
	// the reader waiting for a batch that never comes. (On the primary
	// it covers them anyway.)
	target := f.target
	if fault != faultTargetBelowPublished {
		target = max(target, env.Published)
	}
	f.reads++
	maxBytes := env.ReadAhead
	f.out = &read{Read: Read{ID: f.reads, From: f.cursor, Target: f.capped(target), Limit: FetchLimit(f.cfg.BatchSize, maxBytes, f.eventSize),
		MaxBytes: maxBytes}, resumes: f.resumes, want: target}
	r := f.out.Read
	return &r
}

// ReadAgain gives up the read out (its store call failed) and starts it
// again; an answer of the one given up changes nothing.
func (f *Feed) ReadAgain(env Env) Effects {
	f.out = nil
	return f.Poll(env)
}

// covered reports whether the cursor reached a decided cut.
func (f *Feed) covered() bool {
	return f.cutSet && f.cursor >= f.cut && fault != faultReadsPastTheCut
}

// capped is pos, or a decided cut below it: an old-generation reader
// bounded by a decided cut delivers nothing past it, so its catch-up need
// not cover more.
func (f *Feed) capped(pos int64) int64 {
	if f.cutSet && fault != faultReadsPastTheCut {
		return min(pos, f.cut)
	}
	return pos
}

// full reports whether a batch's worth of events is pending: BatchSize of
// them, or ReadAhead bytes.
func (f *Feed) full(env Env) bool {
	return len(f.pending) >= f.cfg.BatchSize || f.bytes >= env.ReadAhead
}

// Page takes a read's answer.
func (f *Feed) Page(p Page, env Env) Effects {
	if f.out == nil || p.Read != f.out.ID {
		return f.Poll(env) // a read given up: its answer is no news
	}
	r := f.out
	f.out = nil
	events := p.Events
	if n := int64(len(events)); n > 0 {
		f.eventSize = p.Bytes / n
	}
	full := len(events) >= r.Limit || p.Bytes >= r.MaxBytes
	bytes := p.Bytes
	for len(events) > 0 && events[0].Position <= f.cursor {
		// Already queued. (Not seen: a page reads after the cursor, which
		// only pages move while one is out. A guard, should that change.)
		bytes -= events[0].Size()
		events = events[1:]
	}
	f.add(events, bytes)
	if n := len(events); n > 0 {
		f.cursor = max(f.cursor, events[n-1].Position)
	}
	if !full {
		// Everything of the bucket up to the read's snapshot is queued, and
		// that snapshot covers every batch received before it was taken.
		f.cursor = max(f.cursor, r.Target)
		// A batch arrived while reading, or the queue paused: batches it
		// dropped may hold events this read's snapshot missed; or the
		// read was capped at a cut lifted since. Else the catch-up is
		// done.
		want := max(f.target, r.want)
		if fault == faultCappedReadDoneAfterLift {
			want = f.target
		}
		if f.phase == CatchingUp && f.capped(want) <= r.Target && (f.resumes <= r.resumes || fault == faultPauseDoesNotReadOn) {
			f.phase = Live
		}
	}
	return f.Poll(env)
}

// add appends events of size bytes to the pending list.
func (f *Feed) add(events []eventsource.RecordedEvent, bytes int64) {
	if len(events) == 0 {
		return
	}
	if len(f.pending) == 0 {
		f.pending = events // no copy: a page becomes the pending list
	} else {
		f.pending = append(f.pending, events...)
	}
	f.bytes += bytes
}

// Live takes a live batch.
func (f *Feed) Live(b Batch, env Env) Effects {
	switch {
	case f.phase != Live:
		// Taken before the hold: the catch-up reads through it instead.
		// (A guard: the queue hands no batch while held, and a read's
		// target covers Published, which covers every batch posted.)
		f.target = max(f.target, b.To)
	case b.From > f.cursor && fault != faultNoGapCheck:
		// A gap: batches were dropped on overflow. Re-read from the store.
		f.catchUp(b.To)
	default:
		events := b.Events
		for len(events) > 0 && events[0].Position <= f.cursor {
			events = events[1:]
		}
		f.add(events, SizeOf(events))
		f.cursor = max(f.cursor, b.To)
	}
	return f.Poll(env)
}

// catchUp reads the bucket from the store until it covers target. Live
// batches stay in the (bounded) queue meanwhile, so that they cannot
// overtake the catch-up.
func (f *Feed) catchUp(target int64) {
	f.target = max(f.target, target)
	if f.phase == Live {
		f.phase = CatchingUp
	}
}

// Subscribed makes the catch-up read through from, the position the
// reader's subscription starts at: no batch brings an event at or before
// it. A catch-up that ends below it is possible off the primary: the
// publisher may take a fetch it read on the primary (past a lagging
// standby) after this reader read its position and before it takes the
// subscribe, and the reader's page, read on the standby up to that older
// position, then ends below the fetch's events. A gap would show at the
// reader's next batch (see Live), but at the tail of the stream none
// comes.
func (f *Feed) Subscribed(from int64, env Env) Effects {
	switch {
	case f.phase != Live:
		if fault != faultSubscribedIgnoredWhileCatchingUp {
			f.target = max(f.target, from) // the catch-up reads through it
		}
	case f.cursor < from:
		f.catchUp(from)
	}
	return f.Poll(env)
}

// Paused follows internal/overflow's protocol after a pause: the queue
// dropped the batches it held and refuses more until Resume. The feed
// holds the queue, resumes it, and re-reads the store from its cursor
// through the tail — on its own, since the dropped batches may have been
// the last of a burst, and no later batch then comes to reveal the gap.
// Events are appended before they are posted, so a read that starts after
// Resume sees every event of the dropped batches; a catch-up whose read
// began before it reads on (see Page).
func (f *Feed) Paused(env Env) Effects {
	if fault != faultPauseDoesNotCatchUp && f.phase == Live {
		f.phase = CatchingUp
	}
	f.resumes++
	e := f.Poll(env)
	e.Resume = true
	return e
}

// Bound takes a new resize bound: a decided cut is read through (C may be
// above what the live batches brought so far) and no page is read past
// it; a lifted bound reads again from the cursor — live batches beyond
// the bound may have been held back or dropped while the pending list was
// full.
func (f *Feed) Bound(b Bound, env Env) Effects {
	f.cut, f.cutSet = b.Limit, b.Decided || (fault == faultCapOutlivesTheCut && f.cutSet)
	switch {
	case b.Decided:
		f.target = max(f.target, b.Limit)
		if f.cursor < b.Limit {
			f.catchUp(b.Limit)
		}
	case !b.Bounded:
		f.catchUp(f.target)
	}
	return f.Poll(env)
}

// Take removes the first n pending events (at most all) and returns them:
// the window takes them.
func (f *Feed) Take(n int) []eventsource.RecordedEvent {
	n = min(n, len(f.pending))
	taken := f.pending[:n:n]
	f.pending = f.pending[n:]
	if len(f.pending) == 0 {
		f.pending, f.bytes = nil, 0
	} else {
		f.bytes -= SizeOf(taken)
	}
	return taken
}

// PutBack returns events the window took (a batch's events after its
// first) to the front of the pending list, in order.
func (f *Feed) PutBack(events []eventsource.RecordedEvent) {
	if len(events) == 0 {
		return
	}
	pending := make([]eventsource.RecordedEvent, 0, len(events)+len(f.pending))
	f.pending = append(append(pending, events...), f.pending...)
	if fault != faultPutBackUncounted {
		f.bytes += SizeOf(events)
	}
}

// FetchLimit is how many events a read of at most maxBytes asks for, when
// the events last read averaged size bytes: limit, or fewer when large
// events would fill maxBytes first — and at least one more than fit, so
// that the read can tell it is full.
func FetchLimit(limit int, maxBytes, size int64) int {
	if size <= 0 {
		return limit
	}
	return int(min(int64(limit), max(maxBytes/size+1, 1)))
}

// SizeOf is the total eventsource.RecordedEvent.Size of events.
func SizeOf(events []eventsource.RecordedEvent) int64 {
	var n int64
	for i := range events {
		n += events[i].Size()
	}
	return n
}

// fault re-injects one read-side bug fixed in the past (0: none), for the
// simulation to find; set only by TestSimFindsTheFaults, never by the
// code.
var fault faultKind

type faultKind uint8

const (
	faultNone faultKind = iota
	// The read's target leaves out the publisher's position (94dd41a).
	faultTargetBelowPublished
	// The position a subscription starts at is ignored while catching up
	// (8d4aab4).
	faultSubscribedIgnoredWhileCatchingUp
	// A pause resumes the queue but starts no catch-up (6f17b85).
	faultPauseDoesNotCatchUp
	// A catch-up whose read began before a resume does not read on
	// (6f17b85).
	faultPauseDoesNotReadOn
	// A live batch is appended whatever its start (the gap check).
	faultNoGapCheck
	// Pages are read before the checkpoint is loaded (197c042).
	faultReadBeforeLoaded
	// Events put back are not counted in the pending bytes.
	faultPutBackUncounted
	// A reader bounded by a decided cut reads pages past it (the waste).
	faultReadsPastTheCut
	// The cap at a decided cut stays when the bound is lifted (a cap that
	// would not be safe).
	faultCapOutlivesTheCut
	// A read capped at a cut that was lifted while it was out ends the
	// catch-up (found by the simulation in the cap's first version).
	faultCappedReadDoneAfterLift
)
