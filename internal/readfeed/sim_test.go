package readfeed

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/simrun"
)

// The simulation: one reader's read side, the real Feed, against a
// simulated bucket and the world around it, under a seeded scheduler.
//
//   - the store hands out positions in commit order; about half are other
//     buckets' (gaps in this bucket's positions);
//   - a standby replays the store late: a page read there sees a snapshot
//     that may end below what the publisher posted (but covers the read's
//     target, as eventsource.PageReader promises);
//   - the publisher fetches from the primary, moves the published
//     position, and posts this bucket's events in live batches once the
//     reader's subscribe reached it (telling it first where its
//     subscription starts);
//   - the live queue holds batches while told to, and pauses when they
//     find it full: it drops what it holds, refuses more until resumed,
//     and posts a pause signal;
//   - the reader's mailbox takes everything in post order (batches wait
//     while held); page reads run late and fail now and then (read again
//     after a while), so their answers land anywhere among the batches;
//   - the window takes events at random, finishes them, and puts a
//     batch's tail back; a resize cut is decided and lifted at random.
//
// Each seed draws its own weights for these, and its own sizes, lags and
// start times. Invariants are checked after every step: the pending list
// is exactly the bucket's events after what the window took, through the
// cursor (no event skipped, none queued twice, in position order); the
// cursor never goes back; the live queue is held while the feed catches
// up; no page is read while a batch's worth is pending, nor past a
// decided cut; a catch-up ends at or past the publisher's position when
// its last read started; a live feed owes nothing — it has read through
// where its subscription starts and where its next batch will start,
// unless a pause or the subscription's start is on its way to tell it, or
// a decided cut lets it wait. Then the faults stop, and every event must
// be delivered once.
//
//	go test -run TestSim ./internal/readfeed/ -seed N   # replay one seed, with its trace
//	go test -run TestSim ./internal/readfeed/ -seeds 100000

var flags = simrun.Register(2000)

// msgKind is what the reader's mailbox holds.
type msgKind uint8

const (
	msgLoaded msgKind = iota
	msgSubscribed
	msgBatch
	msgPaused
	msgPage
	msgReadFailed
	msgReadAgain
)

type simMsg struct {
	seq   int
	kind  msgKind
	from  int64 // msgSubscribed
	batch Batch
	page  Page
}

func (m simMsg) String() string {
	switch m.kind {
	case msgLoaded:
		return "checkpoint loaded"
	case msgSubscribed:
		return fmt.Sprintf("subscribed from %d", m.from)
	case msgBatch:
		return fmt.Sprintf("batch (%d, %d] %s", m.batch.From, m.batch.To, positions(m.batch.Events))
	case msgPaused:
		return "paused"
	case msgPage:
		return fmt.Sprintf("page #%d %s", m.page.Read, positions(m.page.Events))
	case msgReadFailed:
		return "read failed"
	}
	return "read again"
}

func samePositions(a, b []eventsource.RecordedEvent) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Position != b[i].Position {
			return false
		}
	}
	return true
}

func positions(events []eventsource.RecordedEvent) string {
	var b strings.Builder
	b.WriteString("[")
	for i, e := range events {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprint(&b, e.Position)
	}
	b.WriteString("]")
	return b.String()
}

type sim struct {
	rng     *rand.Rand
	tracing bool
	trace   []string
	failed  string
	steps   int

	// the store
	head       int64
	events     []eventsource.RecordedEvent // the bucket's, in position order
	standby    int64                       // replayed through
	checkpoint int64

	// the publisher
	pos        int64 // published
	subscribe  bool  // the reader's subscribe is on its way
	subscribed bool
	from       int64 // the subscriber's next batch starts after it

	// the live queue and the mailbox
	held     bool
	heldAt   int // the seq posted last before the hold
	paused   bool
	capacity int
	batches  []simMsg
	others   []simMsg
	seq      int

	// the reader
	feed       *Feed
	cfg        Config
	readAhead  int64
	loading    bool             // the checkpoint load is under way
	reads      []Read           // started, not yet run against the store
	pubAt      map[uint64]int64 // the publisher's position when each read started
	told       int64            // the subscription's start, as the reader was told (-1: not yet)
	retryAgain bool             // a failed read waits to be read again
	lastCursor int64
	weights    [14]int // of step's actions, drawn for the seed: each seed stresses other orders
	cuts       int     // cuts left to decide
	startAt    int     // the step the reader starts at: its subscribe and checkpoint load go then
	slowSub    int     // the publisher takes the subscribe at a step with chance 1/slowSub
	loadFirst  bool    // the subscribe is taken after the checkpoint is loaded
	dataSize   int     // events' data is shorter
	lag        int     // the standby replays at a step with chance 1/lag
	aheadSize  int64   // read-ahead bytes are fewer than 400 more
	commits    int     // left to make while the faults go on: the tail of the stream comes at some point

	// the window
	inFlight int
	window   []eventsource.RecordedEvent // taken, not finished
	done     int                         // events of the bucket finished (after the checkpoint)
	cut      int64
	cutSet   bool
}

func newSim(seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, seed^0x5deece66d))
	s := &sim{rng: rng, pubAt: map[uint64]int64{}, told: -1, capacity: 1 + rng.IntN(1+rng.IntN(3)), inFlight: 1 + rng.IntN(4), loading: true, subscribe: true,
		commits: rng.IntN(1 + rng.IntN(40)), cuts: rng.IntN(4), startAt: rng.IntN(1 + rng.IntN(150)),
		slowSub: 1 + rng.IntN(20), loadFirst: rng.IntN(2) == 0, lag: 1 + rng.IntN(10)}
	s.cfg = Config{BatchSize: 2 + rng.IntN(1+rng.IntN(16))}
	s.dataSize, s.aheadSize = 1+rng.IntN(400), 1+rng.Int64N(8000)
	for i := range s.weights {
		s.weights[i] = 1 + rng.IntN(8)
	}
	s.readAhead = s.pickReadAhead()
	s.feed = New(s.cfg)
	// A store with some history: the checkpoint lies in it.
	for range rng.IntN(12) {
		s.commit()
	}
	s.checkpoint = rng.Int64N(s.head + 1)
	s.standby = rng.Int64N(s.head + 1)
	s.pos = rng.Int64N(s.head + 1)
	s.lastCursor = 0
	s.apply("start", s.feed.Poll(s.env()))
	return s
}

func (s *sim) pickReadAhead() int64 { return 400 + s.rng.Int64N(s.aheadSize) }

func (s *sim) env() Env { return Env{Published: s.pos, ReadAhead: s.readAhead} }

func (s *sim) log(format string, args ...any) {
	if s.tracing {
		s.trace = append(s.trace, fmt.Sprintf("%4d ", s.steps)+fmt.Sprintf(format, args...))
	}
}

func (s *sim) fail(format string, args ...any) {
	if s.failed == "" {
		s.failed = fmt.Sprintf(format, args...)
		s.log("VIOLATION: %s", s.failed)
	}
}

// commit hands out the next position: to this bucket or another.
func (s *sim) commit() {
	s.head++
	if s.rng.IntN(2) == 0 {
		s.events = append(s.events, eventsource.RecordedEvent{Position: s.head, Stream: fmt.Sprintf("s%d", s.rng.IntN(3)),
			Data: make([]byte, s.rng.IntN(s.dataSize))})
	}
}

// after is the bucket's events in (from, to].
func (s *sim) after(from, to int64) []eventsource.RecordedEvent {
	i := sort.Search(len(s.events), func(i int) bool { return s.events[i].Position > from })
	j := sort.Search(len(s.events), func(i int) bool { return s.events[i].Position > to })
	return s.events[i:max(i, j):max(i, j)]
}

// post puts a message in the reader's mailbox.
func (s *sim) post(m simMsg) {
	s.seq++
	m.seq = s.seq
	if m.kind == msgBatch {
		s.batches = append(s.batches, m)
	} else {
		s.others = append(s.others, m)
	}
}

// offer posts a live batch to the queue, which pauses when it finds it
// full (internal/overflow's PauseAndResume).
func (s *sim) offer(b Batch) {
	switch {
	case s.paused:
		s.log("publisher: batch (%d, %d] dropped: the queue is paused", b.From, b.To)
	case len(s.batches) >= s.capacity:
		s.log("publisher: batch (%d, %d] finds the queue full: it pauses, dropping %d", b.From, b.To, len(s.batches))
		s.batches, s.paused = nil, true
		s.post(simMsg{kind: msgPaused})
	default:
		s.log("publisher: batch (%d, %d] %s queued", b.From, b.To, positions(b.Events))
		s.post(simMsg{kind: msgBatch, batch: b})
	}
}

// apply carries out the feed's effects, as the actor does, and checks
// the read it starts.
func (s *sim) apply(input string, e Effects) {
	s.log("%s → %s%s", input, effects(e), s.feed)
	switch {
	case e.Hold:
		s.held, s.heldAt = true, s.seq
	case e.Release:
		s.held = false
	}
	if e.Resume {
		s.paused = false
	}
	if r := e.Read; r != nil {
		if s.loading {
			s.fail("read #%d started before the checkpoint was loaded", r.ID)
		}
		if n, bytes := len(s.feed.pending), SizeOf(s.feed.pending); n >= s.cfg.BatchSize || bytes >= s.readAhead {
			s.fail("read #%d started with a batch's worth pending (%d events, %d bytes)", r.ID, n, bytes)
		}
		if s.cutSet && (r.Target > s.cut || s.feed.cursor >= s.cut) {
			s.fail("read #%d (%d, %d] reads past the decided cut %d", r.ID, r.From, r.Target, s.cut)
		}
		s.reads = append(s.reads, *r)
		s.pubAt[r.ID] = s.pos
	}
}

func effects(e Effects) string {
	var b strings.Builder
	if e.Hold {
		b.WriteString("hold; ")
	}
	if e.Release {
		b.WriteString("release; ")
	}
	if e.Resume {
		b.WriteString("resume; ")
	}
	if e.Read != nil {
		fmt.Fprintf(&b, "read #%d (%d, %d] limit %d/%dB; ", e.Read.ID, e.Read.From, e.Read.Target, e.Read.Limit, e.Read.MaxBytes)
	}
	return b.String()
}

// base is the position after which the next event of the window lies:
// the last it took, or the checkpoint.
func (s *sim) base() int64 {
	if n := len(s.window); n > 0 {
		return s.window[n-1].Position
	}
	if s.done > 0 {
		return s.after(s.checkpoint, s.head)[s.done-1].Position
	}
	return s.checkpoint
}

func (s *sim) afterCheckpoint() []eventsource.RecordedEvent { return s.after(s.checkpoint, s.head) }

// receive hands the reader the oldest message it may take.
func (s *sim) receive() bool {
	var m simMsg
	// A batch posted before the hold may still come, as if taken just
	// before it (more than protoactor's mailbox does: it checks the hold
	// at every message).
	early := s.held && len(s.batches) > 0 && s.batches[0].seq <= s.heldAt && s.rng.IntN(4) == 0
	switch {
	case early:
		m, s.batches = s.batches[0], s.batches[1:]
		s.log("a batch taken just before the hold")
	case len(s.others) > 0 && (s.held || len(s.batches) == 0 || s.others[0].seq < s.batches[0].seq):
		m, s.others = s.others[0], s.others[1:]
	case len(s.batches) > 0 && !s.held:
		m, s.batches = s.batches[0], s.batches[1:]
	default:
		return false
	}
	env := s.env()
	switch m.kind {
	case msgLoaded:
		s.loading = false
		s.apply(m.String(), s.feed.Loaded(s.checkpoint, env))
	case msgSubscribed:
		s.told = m.from
		s.apply(m.String(), s.feed.Subscribed(m.from, env))
	case msgBatch:
		s.apply(m.String(), s.feed.Live(m.batch, env))
	case msgPaused:
		s.apply(m.String(), s.feed.Paused(env))
	case msgPage:
		was := s.feed.phase
		s.apply(m.String(), s.feed.Page(m.page, env))
		// A catch-up ends at or past what the publisher had posted when its
		// last read started (batches a pause dropped may hold those
		// events), or at the decided cut.
		if pub := s.pubAt[m.page.Read]; was == CatchingUp && s.feed.phase == Live && s.feed.cursor < pub &&
			(!s.cutSet || s.feed.cursor < s.cut) {
			s.fail("the catch-up ended at %d, below the publisher's %d when its read started", s.feed.cursor, pub)
		}
	case msgReadFailed:
		s.log("read failed: read again after a while")
		s.retryAgain = true
	case msgReadAgain:
		s.apply(m.String(), s.feed.ReadAgain(env))
	}
	return true
}

// runRead runs the oldest read started against the store: on the
// primary (every position handed out) or on the lagging standby (waiting
// for it to replay the read's target).
func (s *sim) runRead(faults bool) {
	r := s.reads[0]
	s.reads = s.reads[1:]
	if faults && s.rng.IntN(8) == 0 {
		s.log("read #%d fails", r.ID)
		s.post(simMsg{kind: msgReadFailed})
		return
	}
	snapshot, where := s.head, "primary"
	if s.rng.IntN(3) > 0 {
		s.standby = max(s.standby, r.Target)
		snapshot, where = s.standby, "standby"
	}
	var page []eventsource.RecordedEvent
	var bytes int64
	for _, e := range s.after(r.From, snapshot) {
		if len(page) >= r.Limit || bytes >= r.MaxBytes {
			break
		}
		page = append(page, e)
		bytes += e.Size()
	}
	s.log("read #%d runs on the %s through %d: %s", r.ID, where, snapshot, positions(page))
	s.post(simMsg{kind: msgPage, page: Page{Read: r.ID, Events: page, Bytes: bytes}})
}

// fetch is one publisher fetch from the primary.
func (s *sim) fetch() {
	to := s.pos + 1 + s.rng.Int64N(s.head-s.pos)
	s.pos = to // published before the batches are posted
	if !s.subscribed {
		s.log("publisher fetches through %d (no subscriber yet)", to)
		return
	}
	if events := s.after(s.from, to); len(events) > 0 {
		b := Batch{From: s.from, To: to, Events: events}
		s.from = to
		s.offer(b)
		return
	}
	s.log("publisher fetches through %d: nothing of the bucket", to)
}

// take is the window taking events, as the actor's pump does: up to its
// room, none beyond a decided cut.
func (s *sim) take(most int) {
	n := 0
	for _, e := range s.feed.Pending() {
		if n >= most || (s.cutSet && e.Position > s.cut) {
			break
		}
		n++
	}
	taken := s.feed.Take(n)
	for _, e := range taken {
		want := s.after(s.base(), s.head)
		switch {
		case e.Position <= s.checkpoint:
			s.fail("the window took %d, which the checkpoint %d covers", e.Position, s.checkpoint)
		case len(want) == 0 || e.Position < want[0].Position:
			s.fail("the window took %d again (after %d)", e.Position, s.base())
		case e.Position > want[0].Position:
			s.fail("the window took %d, skipping %d", e.Position, want[0].Position)
		}
		s.window = append(s.window, e)
	}
	s.apply(fmt.Sprintf("window takes %s", positions(taken)), s.feed.Poll(s.env()))
}

// check tests the invariants.
func (s *sim) check() {
	f := s.feed
	if f.cursor < s.lastCursor {
		s.fail("the cursor went back from %d to %d", s.lastCursor, f.cursor)
	}
	s.lastCursor = f.cursor
	if f.phase != Live && !f.held {
		s.fail("the live queue is not held while %s", f.phase)
	}
	if f.held != s.held {
		s.fail("the feed thinks the queue held %v, it is %v", f.held, s.held)
	}
	if got := SizeOf(f.pending); got != f.bytes {
		s.fail("the pending bytes are counted %d, they are %d", f.bytes, got)
	}
	if f.phase == Loading {
		if len(f.pending) > 0 {
			s.fail("events pending before the checkpoint is loaded: %s", positions(f.pending))
		}
		return
	}
	// Live, the feed owes nothing: every event the publisher will not
	// bring (through where its subscriber's next batch starts) is queued,
	// unless something on its way tells it otherwise (a pause, the
	// subscription's start) or a decided cut lets it wait.
	if owed := s.owed(); f.phase == Live && f.cursor < owed && !s.cutSet && !s.telling() {
		s.fail("live at %d, but no batch brings the events through %d", f.cursor, owed)
	}
	// Live, it has read through where its subscription starts, once told
	// (no batch brings what lies before), or to the decided cut.
	if f.phase == Live && f.cursor < s.told && (!s.cutSet || f.cursor < s.cut) {
		s.fail("live at %d, below the subscription's start %d", f.cursor, s.told)
	}
	want := s.after(s.base(), max(f.cursor, s.base()))
	if !samePositions(want, f.pending) {
		s.fail("pending %s, but the bucket's events after %d through the cursor %d are %s",
			positions(f.pending), s.base(), f.cursor, positions(want))
	}
}

// step runs one random action.
func (s *sim) step(faults bool) bool {
	s.steps++
	type action struct {
		weight int
		run    func()
	}
	var acts []action
	k := 0
	add := func(ok bool, run func()) {
		if k++; ok {
			acts = append(acts, action{s.weights[k-1], run})
		}
	}
	add(faults && s.commits > 0, func() { s.commits--; s.commit(); s.log("commit: head %d", s.head) })
	add(s.standby < s.head && (!faults || s.rng.IntN(s.lag) == 0), func() {
		s.standby += 1 + s.rng.Int64N(min(s.head-s.standby, 3))
		s.log("the standby replays through %d", s.standby)
	})
	// (Above all while the queue is held: the batches then fill it, and it
	// pauses.)
	add(s.pos < s.head && (!faults || s.held || s.rng.IntN(3) == 0), s.fetch)
	// (In some seeds the publisher takes the subscribe only once the
	// checkpoint is loaded: the reader's first read then races the
	// publisher's fetches and the subscribe.)
	add(s.subscribe && s.steps >= s.startAt && (!s.loadFirst || !s.loading) &&
		(!faults || s.feed.Reading() || s.rng.IntN(s.slowSub) == 0), func() {
		s.subscribe, s.subscribed, s.from = false, true, s.pos
		s.log("publisher takes the subscribe at %d", s.pos)
		s.post(simMsg{kind: msgSubscribed, from: s.pos})
	})
	add(s.loading && s.steps >= s.startAt && !s.queuedLoad(), func() { s.post(simMsg{kind: msgLoaded}) })
	add(len(s.reads) > 0, func() { s.runRead(faults) })
	add(s.retryAgain, func() { s.retryAgain = false; s.post(simMsg{kind: msgReadAgain}) })
	add(s.deliverable(), func() { s.receive() })
	add(len(s.window) < s.inFlight && s.takeable(), func() { s.take(1 + s.rng.IntN(s.inFlight-len(s.window))) })
	add(len(s.window) > 0, func() {
		s.log("the window finishes %d", s.window[0].Position)
		s.window = s.window[1:]
		s.done++
	})
	add(faults && len(s.window) > 1, func() {
		k := 1 + s.rng.IntN(len(s.window)-1)
		back := append([]eventsource.RecordedEvent(nil), s.window[len(s.window)-k:]...)
		s.window = s.window[:len(s.window)-k]
		s.feed.PutBack(back)
		s.apply(fmt.Sprintf("the window puts back %s", positions(back)), s.feed.Poll(s.env()))
	})
	add(faults, func() {
		s.readAhead = s.pickReadAhead()
		s.log("read-ahead now %d bytes", s.readAhead)
	})
	// (Decided above all while catching up: the catch-up's next read is
	// capped at it.)
	add(faults && s.cuts > 0 && !s.cutSet && !s.loading && (s.feed.Phase() == CatchingUp || s.rng.IntN(4) == 0), func() {
		s.cuts--
		// A cut is never below what the slot delivered (its proposal is
		// its frozen cursor).
		s.cut, s.cutSet = s.base()+s.rng.Int64N(s.head-s.base()+1), true
		s.apply(fmt.Sprintf("cut decided at %d", s.cut), s.feed.Bound(Bound{Bounded: true, Decided: true, Limit: s.cut}, s.env()))
	})
	// (Lifted above all while a read capped at it is out: it then answers
	// for a bound that is gone.)
	capped := s.feed.out != nil && s.feed.out.Target < s.feed.out.want
	add(faults && s.cutSet && (capped || s.rng.IntN(4) == 0), func() {
		s.cutSet = false
		s.apply(fmt.Sprintf("cut %d lifted", s.cut), s.feed.Bound(Bound{}, s.env()))
	})
	if len(acts) == 0 {
		return false
	}
	total := 0
	for _, a := range acts {
		total += a.weight
	}
	n := s.rng.IntN(total)
	for _, a := range acts {
		if n -= a.weight; n < 0 {
			a.run()
			break
		}
	}
	s.check()
	return true
}

// owed is where the next batch the reader gets starts: what the
// publisher will not bring.
func (s *sim) owed() int64 {
	if !s.subscribed {
		return 0
	}
	if len(s.batches) > 0 {
		return s.batches[0].batch.From
	}
	return s.from
}

// telling reports whether a pause or the subscription's start is on its
// way to the reader.
func (s *sim) telling() bool {
	for _, m := range s.others {
		if m.kind == msgPaused || m.kind == msgSubscribed {
			return true
		}
	}
	return s.paused
}

func (s *sim) queuedLoad() bool {
	for _, m := range s.others {
		if m.kind == msgLoaded {
			return true
		}
	}
	return false
}

func (s *sim) deliverable() bool {
	return len(s.others) > 0 || (len(s.batches) > 0 && (!s.held || s.batches[0].seq <= s.heldAt))
}

func (s *sim) takeable() bool {
	p := s.feed.Pending()
	return len(p) > 0 && (!s.cutSet || p[0].Position <= s.cut)
}

// run runs the schedule: a while with faults, then without until nothing
// is left to do; it returns the first violation ("" if none).
func (s *sim) run() string {
	for range 150 + s.rng.IntN(150) {
		if s.step(true); s.failed != "" {
			return s.failed
		}
	}
	s.log("the faults stop")
	for s.step(false) {
		if s.failed != "" {
			return s.failed
		}
		if s.steps > 20000 {
			s.fail("no end after %d steps", s.steps)
			return s.failed
		}
	}
	want := s.afterCheckpoint()
	if s.cutSet {
		want = s.after(s.checkpoint, s.cut)
	}
	if s.done < len(want) {
		s.fail("stalled: %d of the %d events after the checkpoint %d delivered; next %d; feed %s",
			s.done, len(want), s.checkpoint, want[s.done].Position, s.feed)
	}
	return s.failed
}

// replay runs seed again, tracing: the same schedule, step for step.
func replay(seed uint64) *sim {
	s := newSim(seed)
	s.tracing = true
	s.failed = s.run()
	return s
}

// theSim is the simulation as internal/simrun runs it.
func theSim() simrun.Sim {
	var fs []simrun.Fault
	for _, m := range faults {
		fs = append(fs, simrun.Switch(m.name, &fault, m.fault, faultNone))
	}
	return simrun.Sim{
		Check:  func(seed uint64) string { return newSim(seed).run() },
		Replay: func(seed uint64) simrun.Run { s := replay(seed); return simrun.Run{Failed: s.failed, Trace: s.trace} },
		Faults: fs,
		Noise:  func(l string) bool { return strings.Contains(l, "read-ahead now") }, // a quiet stretch
	}
}

// TestSim runs the simulation over many seeds; a failing seed prints its
// trace's tail and replays with -seed.
func TestSim(t *testing.T) { flags.TestSim(t, theSim()) }

// faults are the read-side bugs fixed in the past, by name (see fault).
var faults = []struct {
	name  string
	fault faultKind
}{
	{"TargetBelowPublished", faultTargetBelowPublished},
	{"SubscribedIgnoredWhileCatchingUp", faultSubscribedIgnoredWhileCatchingUp},
	{"PauseDoesNotCatchUp", faultPauseDoesNotCatchUp},
	{"PauseDoesNotReadOn", faultPauseDoesNotReadOn},
	{"NoGapCheck", faultNoGapCheck},
	{"ReadBeforeLoaded", faultReadBeforeLoaded},
	{"PutBackUncounted", faultPutBackUncounted},
	{"ReadsPastTheCut", faultReadsPastTheCut},
	{"CapOutlivesTheCut", faultCapOutlivesTheCut},
	{"CappedReadDoneAfterLift", faultCappedReadDoneAfterLift},
}

// TestSimFindsTheFaults re-injects each read-side bug fixed in the past,
// one at a time, and requires it found within the seeds TestSim runs: a
// bug it could not find would be a gap in the simulation.
func TestSimFindsTheFaults(t *testing.T) { flags.TestSimFindsTheFaults(t, theSim()) }
