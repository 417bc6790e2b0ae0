package checkpointing

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kumi-run/kumi/internal/simrun"
)

// The simulation: a bucket's readers, each with the real State for its
// checkpoint side, under a seeded scheduler.
//
//   - the bucket holds events at positions with gaps (other buckets');
//   - a reader's window takes them in order, at most MaxInFlight at a
//     time, and moves the acknowledged position over its finished prefix
//     (as actors/deliver.go's finish does);
//   - the handler finishes deliveries in any order and answers late, some
//     answers twice: an ack, a retry (redelivered after a while), a dead
//     letter, or — with MaxInFlight 1 — a commit that writes the
//     checkpoint itself, fenced;
//   - checkpoint writes run late, land in the store (which only moves the
//     checkpoint forward, GREATEST) or fail: transiently, with the fence
//     lost, the server changed, or for good;
//   - ticks, drains for a handoff, a lease found unsure (held after all,
//     or lost), a lease lost unseen (the next write finds the fence gone),
//     a restart of the reader at the same epoch (the next one starts after
//     the handled mark), a crash of the process (marks lost, the bucket
//     taken again at a new epoch from the stored checkpoint).
//
// Invariants after every step: nothing at or before the stored checkpoint
// or the acknowledged position is unfinished (no skip); neither goes back
// within a reader; the written position is never above the store's; at
// most one write is out; a tick writes what was acknowledged before it (no
// write out and none failed since: the written position is at or past
// what was acknowledged at the last tick that found no write out, or where
// the reader resumed); a drain for a handoff ends with everything up to
// the drain point acknowledged and written, an unsure one with everything
// acknowledged written unless its write failed; an event a handler
// finished is delivered again only after a crash, a lost lease, a server
// change, a restart for good or in flight as a reader was restarted — not
// on a graceful path (a handoff, a transient failure, an unsure lease held
// after all). Then the faults stop, and every event must be finished and
// written.
//
//	go test -run TestSim ./internal/checkpointing/ -seed N   # replay one seed, with its trace
//	go test -run TestSim ./internal/checkpointing/ -seeds 100000

var flags = simrun.Register(2000)

type slotState uint8

const (
	sent slotState = iota
	retrying
	done
)

type slot struct {
	pos     int64
	state   slotState
	attempt int
	onDrain bool // sent again at once by a drain
}

type msgKind uint8

const (
	msgAnswer msgKind = iota
	msgRedeliver
	msgWritten
)

type outcome uint8

const (
	ack outcome = iota
	retry
	deadLetter
	commit
)

func (o outcome) String() string { return [...]string{"ack", "retry", "dead letter", "commit"}[o] }

type simMsg struct {
	kind    msgKind
	inc     int // the reader incarnation it is for
	pos     int64
	attempt int
	outcome outcome
	write   Write
	epoch   int64 // the epoch a write is fenced with: its reader's
}

// rdr is one reader incarnation.
type rdr struct {
	inc   int
	epoch int64
	cp    *State
	slots []*slot
	next  int // index of the next event to take
	// handling: deliveries the handler has and has not finished.
	handling []simMsg
	draining bool
	handoff  bool // the drain is a handoff (or the final one)
	unsure   bool
	writes   int // writes out
	failing  bool
	// tickAcked is what was acknowledged at the last tick that found no
	// write out, or where the reader resumed.
	tickAcked      int64
	acked, flushed int64 // as last seen, to check they never go back
}

type sim struct {
	rng     *rand.Rand
	tracing bool
	trace   []string
	failed  string
	steps   int

	every, inFlight int
	commits         bool
	w               struct{ answer, tick, take, work, fault int }

	events  []int64
	stored  int64
	epoch   int64 // the lease's epoch now
	ours    bool  // the lease is held by the reader's worker at epoch
	mark    struct{ epoch, pos int64 }
	handled map[int64]bool // a handler finished it
	excused map[int64]bool // may be delivered again (not a graceful path)
	msgs    []simMsg
	r       *rdr
	incs    int
	faults  bool
	over    bool // the final drain ended
}

func newSim(seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	s := &sim{rng: rng, every: 1 + rng.IntN(6), inFlight: 1 + rng.IntN(4), handled: map[int64]bool{}, excused: map[int64]bool{},
		epoch: 1, ours: true}
	if rng.IntN(3) == 0 {
		s.inFlight = 1
	}
	s.commits = s.inFlight == 1 && rng.IntN(2) == 0
	s.w.answer, s.w.tick, s.w.take, s.w.work, s.w.fault = 2+rng.IntN(8), 1+rng.IntN(4), 2+rng.IntN(8), 2+rng.IntN(8), 1+rng.IntN(3)
	pos := int64(0)
	for range 20 + rng.IntN(60) {
		pos += 1 + rng.Int64N(3)
		s.events = append(s.events, pos)
	}
	return s
}

func (s *sim) log(format string, args ...any) {
	if s.tracing {
		s.trace = append(s.trace, fmt.Sprintf("%4d ", s.steps)+fmt.Sprintf(format, args...))
	}
}

func (s *sim) fail(format string, args ...any) {
	if s.failed == "" {
		s.failed = fmt.Sprintf("step %d: ", s.steps) + fmt.Sprintf(format, args...)
		s.log("FAIL %s", s.failed)
	}
}

func (s *sim) env() Env { return Env{Unsure: s.r != nil && s.r.unsure} }

// start starts the bucket's next reader at the lease's epoch: from the
// stored checkpoint, or after the handled mark at the same epoch.
func (s *sim) start() {
	s.incs++
	r := &rdr{inc: s.incs, epoch: s.epoch, cp: New(Config{Every: s.every})}
	s.r = r
	mark := int64(0)
	if s.mark.epoch == s.epoch {
		mark = s.mark.pos
	}
	e := r.cp.Resume(s.stored, mark)
	r.tickAcked = r.cp.Acked()
	for r.next < len(s.events) && s.events[r.next] <= r.cp.Acked() {
		r.next++
	}
	s.log("reader %d starts at epoch %d: checkpoint %d mark %d → %s", r.inc, r.epoch, s.stored, mark, r.cp)
	s.do(e)
}

// stop ends the reader; its successor starts at once (the lease is
// renewed, or taken again at a new epoch by the next owner).
func (s *sim) stop(why string, handled int64) {
	r := s.r
	for _, m := range r.handling {
		// A handler the reader gave up on may still finish what it has
		// (its stop waits for the call to return); the answer is lost.
		if s.rng.IntN(2) == 0 {
			s.handled[m.pos] = true
			s.log("handler finishes %d attempt %d, unanswered", m.pos, m.attempt)
		}
	}
	if s.ours && handled >= 0 && s.mark.epoch == r.epoch {
		s.mark.pos = max(s.mark.pos, handled)
	} else if s.ours && handled >= 0 {
		s.mark.epoch, s.mark.pos = r.epoch, handled
	}
	s.log("reader %d stops: %s", r.inc, why)
	s.r = nil
	if !s.ours {
		s.takeOver()
	}
	s.start()
}

// takeOver: the bucket's next owner takes the lease at a new epoch and
// starts from the stored checkpoint: whatever was finished after it may
// be delivered again.
func (s *sim) takeOver() {
	s.epoch++
	s.ours = true
	s.excuseAfter(s.stored)
	s.log("the bucket is taken at epoch %d from %d", s.epoch, s.stored)
}

func (s *sim) excuseAfter(pos int64) {
	for _, p := range s.events {
		if p > pos {
			s.excused[p] = true
		}
	}
}

// excuseWindow: a reader stopped at once gives up what its handler has,
// and what it finished behind an unfinished event (the acknowledged
// position stops before it): the next reader delivers them again.
func (s *sim) excuseWindow() {
	for _, sl := range s.r.slots {
		s.excused[sl.pos] = true
	}
}

func (s *sim) do(e Effects) {
	if e.Write != nil {
		s.r.writes++
		s.msgs = append(s.msgs, simMsg{kind: msgWritten, inc: s.r.inc, write: *e.Write, epoch: s.r.epoch})
		s.log("  write #%d at %d", e.Write.ID, e.Write.Pos)
	}
	if e.Progress {
		s.log("  progress %d", s.r.cp.Flushed())
	}
}

func (s *sim) send(sl *slot) {
	p := sl.pos
	if s.handled[p] && !s.excused[p] {
		s.fail("event %d delivered again (attempt %d) after a handler finished it, on a graceful path", p, sl.attempt)
	}
	sl.state = sent
	s.r.handling = append(s.r.handling, simMsg{kind: msgAnswer, inc: s.r.inc, pos: p, attempt: sl.attempt})
	s.log("deliver %d attempt %d", p, sl.attempt)
}

// take takes the next event into the window and delivers it.
func (s *sim) take() {
	r := s.r
	sl := &slot{pos: s.events[r.next]}
	r.next++
	r.slots = append(r.slots, sl)
	s.send(sl)
}

func (r *rdr) active() int {
	n := 0
	for _, sl := range r.slots {
		if sl.state == sent {
			n++
		}
	}
	return n
}

func (r *rdr) slot(pos int64) *slot {
	for _, sl := range r.slots {
		if sl.pos == pos {
			return sl
		}
	}
	return nil
}

// work: the handler finishes one delivery it has (in any order) and
// answers, sometimes twice.
func (s *sim) work() {
	r := s.r
	i := s.rng.IntN(len(r.handling))
	m := r.handling[i]
	r.handling = append(r.handling[:i], r.handling[i+1:]...)
	m.outcome = ack
	switch n := s.rng.IntN(100); {
	case !s.faults || r.slot(m.pos).onDrain:
	case n < 15:
		m.outcome = retry
	case n < 20:
		m.outcome = deadLetter
	case n < 40 && s.commits:
		m.outcome = commit
	}
	if m.outcome == commit {
		if s.ours && s.epoch == r.epoch {
			s.stored = max(s.stored, m.pos)
		} else {
			m.outcome = retry // its transaction failed the fence
		}
	}
	if m.outcome != retry {
		s.handled[m.pos] = true
	}
	s.log("handler finishes %d attempt %d: %s", m.pos, m.attempt, m.outcome)
	s.msgs = append(s.msgs, m)
	if s.faults && s.rng.IntN(10) == 0 {
		s.msgs = append(s.msgs, m) // answered twice
	}
}

// answer takes a handler's answer, as the actor's onHandlerReply does:
// one of an attempt given up, of another incarnation, or twice, changes
// nothing.
func (s *sim) answer(m simMsg) {
	r := s.r
	sl := r.slot(m.pos)
	if sl == nil || sl.state != sent || sl.attempt != m.attempt {
		s.log("answer %d attempt %d: stale", m.pos, m.attempt)
		return
	}
	s.log("answer %d attempt %d: %s", m.pos, m.attempt, m.outcome)
	if m.outcome == retry {
		sl.state, sl.attempt = retrying, sl.attempt+1
		s.msgs = append(s.msgs, simMsg{kind: msgRedeliver, inc: r.inc, pos: m.pos, attempt: sl.attempt})
		return
	}
	sl.state = done
	a := Ack{}
	for len(r.slots) > 0 && r.slots[0].state == done {
		a.Through = r.slots[0].pos
		a.Events++
		r.slots = r.slots[1:]
	}
	if m.outcome == commit {
		a.Committed = m.pos
	}
	s.do(r.cp.Finished(a))
}

func (s *sim) written(m simMsg) {
	var f Failure
	ok := false
	switch n := s.rng.IntN(100); {
	case !s.ours || s.epoch != m.epoch:
		f = FenceLost
	case s.faults && s.r != nil && s.r.unsure && n < 50:
		f = Transient // a lease found unsure: the database is failing
	case !s.faults || n < 80:
		ok = true
	case n < 92:
		f = Transient
	case n < 95:
		f = ServerChanged
	default:
		f = Permanent
	}
	if ok {
		s.stored = max(s.stored, m.write.Pos)
	}
	if s.r == nil || m.inc != s.r.inc {
		s.log("write #%d at %d of reader %d lands: %v", m.write.ID, m.write.Pos, m.inc, ok)
		return
	}
	r := s.r
	r.writes--
	if ok {
		s.log("write #%d at %d written", m.write.ID, m.write.Pos)
		r.failing = false
		s.do(r.cp.Written(m.write.ID))
		return
	}
	v := r.cp.Failed(m.write.ID, f, s.env())
	s.log("write #%d at %d failed (%s): %s", m.write.ID, m.write.Pos, f, v)
	switch v {
	case RetryOnTick, EndUnwritten:
		r.failing = true
	case StopLost:
		if s.ours {
			// The lease was held after all (a renewal that ran late): the
			// successor at the same epoch starts after the mark, and the
			// answers given up here are duplicates (what was finished
			// behind a retrying event is repeated, as after a drain).
			for _, sl := range r.slots {
				if sl.state != sent {
					s.excused[sl.pos] = true
				}
			}
			s.stop("stopped on a failed write", r.cp.Acked())
			return
		}
		s.excuseWindow()
		s.stop("fence lost", -1)
	case NewEpoch:
		s.excuseAfter(s.stored)
		s.mark.epoch = 0 // a mark of another server
		s.stop("server changed", -1)
	case Fail:
		if f != Transient {
			s.excuseWindow() // a failure for good is not a graceful path
		}
		s.stop("failed", r.cp.Acked())
	}
}

// drainStep sends, during a drain, a retrying slot at once (as
// actors/deliver.go's sendOnDrain does), and ends the drain once nothing
// is with the handler and the checkpoint side says so.
func (s *sim) drainStep() {
	r := s.r
	if r == nil || !r.draining {
		return
	}
	if !r.unsure {
		for _, sl := range r.slots {
			if sl.state == retrying && !sl.onDrain {
				sl.onDrain = true
				s.send(sl)
			}
		}
	}
	if r.active() > 0 {
		return
	}
	e, ended := r.cp.Drain(s.env())
	s.do(e)
	if !ended {
		return
	}
	s.log("drain ends: %s, stored %d", r.cp, s.stored)
	if r.cp.Phase() != Abandoned && s.stored < r.cp.Acked() {
		s.fail("a drain ended with %d acknowledged but %d written", r.cp.Acked(), s.stored)
	}
	if r.handoff {
		if len(r.slots) > 0 {
			s.fail("a drain for a handoff ended with %d left in the window", len(r.slots))
		}
		if n := r.next; n > 0 && r.cp.Acked() < s.events[n-1] {
			s.fail("a drain for a handoff ended at %d acknowledged, before its last event taken, %d", r.cp.Acked(), s.events[n-1])
		}
		if !s.faults && r.next == len(s.events) {
			s.log("the final drain ends")
			s.over = true
			return
		}
		s.epoch++ // the next owner, at a new epoch, from the stored checkpoint
		s.mark.epoch = 0
		s.stop("drained for a handoff", -1)
		return
	}
	// MaxInFlight above 1: what was finished after a retrying event left
	// in the window is repeated by the next reader (docs/guarantees.md).
	for _, sl := range r.slots {
		s.excused[sl.pos] = true
	}
	s.stop("drained unsure", r.cp.Acked())
}

func (s *sim) check() {
	r := s.r
	for _, p := range s.events {
		if p <= s.stored && !s.handled[p] {
			s.fail("the stored checkpoint %d passes the unfinished event %d", s.stored, p)
			return
		}
		if r != nil && p <= r.cp.Acked() && !s.handled[p] {
			s.fail("the acknowledged position %d passes the unfinished event %d", r.cp.Acked(), p)
			return
		}
	}
	if r == nil {
		return
	}
	switch {
	case r.cp.Acked() < r.acked:
		s.fail("the acknowledged position went back: %d after %d", r.cp.Acked(), r.acked)
	case r.cp.Flushed() < r.flushed:
		s.fail("the written position went back: %d after %d", r.cp.Flushed(), r.flushed)
	case r.cp.Flushed() > s.stored && s.ours && s.epoch == r.epoch:
		s.fail("the written position %d is above the store's checkpoint %d", r.cp.Flushed(), s.stored)
	case r.writes > 1:
		s.fail("%d checkpoint writes out at once", r.writes)
	case r.cp.Phase() == Idle && !r.failing && r.cp.Flushed() < r.tickAcked:
		s.fail("no write out, none failed, and %d acknowledged by the last tick is not written (written %d)", r.tickAcked, r.cp.Flushed())
	}
	r.acked, r.flushed = r.cp.Acked(), r.cp.Flushed()
}

// step runs one step of the schedule; it reports false when nothing is
// left to do.
func (s *sim) step() bool {
	if s.over {
		return false
	}
	s.steps++
	r := s.r
	canTake := !r.draining && !r.unsure && r.next < len(s.events) && len(r.slots) < s.inFlight
	type choice struct {
		w  int
		fn func()
	}
	var cs []choice
	if len(s.msgs) > 0 {
		cs = append(cs, choice{s.w.answer, s.receive})
	}
	if canTake {
		cs = append(cs, choice{s.w.take, s.take})
	}
	if len(r.handling) > 0 {
		cs = append(cs, choice{s.w.work, s.work})
	}
	if len(cs) > 0 || r.cp.Phase() == Idle && r.cp.Acked() > r.cp.Flushed() {
		cs = append(cs, choice{s.w.tick, s.tick})
	}
	if s.faults {
		cs = append(cs, choice{s.w.fault, s.fault})
	}
	if len(cs) == 0 {
		if !r.draining {
			// The end: a last drain, as a graceful stop does.
			s.log("the final drain")
			r.draining, r.handoff = true, true
			s.drainStep()
			s.check()
			return true
		}
		return false
	}
	total := 0
	for _, c := range cs {
		total += c.w
	}
	n := s.rng.IntN(total)
	for _, c := range cs {
		if n < c.w {
			c.fn()
			break
		}
		n -= c.w
	}
	s.drainStep()
	s.check()
	return true
}

func (s *sim) tick() {
	r := s.r
	_, writing := r.cp.Out()
	s.log("tick")
	s.do(r.cp.Tick())
	if !writing {
		r.tickAcked = r.cp.Acked()
	}
}

func (s *sim) receive() {
	i := s.rng.IntN(len(s.msgs))
	m := s.msgs[i]
	s.msgs = append(s.msgs[:i], s.msgs[i+1:]...)
	if m.kind == msgWritten {
		s.written(m)
		return
	}
	if m.inc != s.r.inc {
		return // of a reader gone
	}
	switch m.kind {
	case msgAnswer:
		s.answer(m)
	case msgRedeliver:
		if sl := s.r.slot(m.pos); sl != nil && sl.state == retrying && sl.attempt == m.attempt && !s.r.draining && !s.r.unsure {
			s.send(sl)
		}
	}
}

// fault injects one of the world's faults.
func (s *sim) fault() {
	r := s.r
	switch n := s.rng.IntN(100); {
	case n < 25:
		if !r.draining {
			s.log("drain for a handoff")
			r.draining, r.handoff = true, true
		}
	case n < 45:
		if !r.unsure {
			r.unsure, r.draining, r.handoff = true, true, false
			if s.rng.IntN(3) == 0 {
				s.ours = false
				s.log("the lease is unsure, and lost")
			} else {
				s.log("the lease is unsure (held after all)")
			}
		}
	case n < 55:
		if s.ours {
			s.ours = false
			s.log("the lease is lost unseen")
		}
	case n < 80:
		// A supervision restart at the same epoch: what the handler has
		// is given up; the next reader starts after the mark.
		s.excuseWindow()
		s.stop("restarted", r.cp.Acked())
	default:
		// The process dies: its marks with it; the bucket is taken again.
		s.log("the process crashes")
		s.mark.epoch = 0
		s.r, s.ours = nil, false
		s.takeOver()
		s.msgs = nil
		s.start()
	}
}

// run runs the schedule: a while with faults, then without until nothing
// is left to do; it returns the first violation ("" if none).
func (s *sim) run() string {
	s.faults = true
	s.start()
	for range 100 + s.rng.IntN(200) {
		if s.step(); s.failed != "" {
			return s.failed
		}
	}
	s.faults = false
	s.log("the faults stop")
	if !s.ours {
		s.stop("the lease is found lost", -1)
	}
	for s.step() {
		if s.failed != "" {
			return s.failed
		}
		if s.steps > 20000 {
			s.fail("no end after %d steps", s.steps)
			return s.failed
		}
	}
	for _, p := range s.events {
		if !s.handled[p] {
			s.fail("stalled: event %d never finished", p)
			break
		}
	}
	if last := s.events[len(s.events)-1]; s.failed == "" && s.stored != last {
		s.fail("the stored checkpoint ends at %d, not at the last event %d", s.stored, last)
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
		Check: func(seed uint64) string { return newSim(seed).run() },
		Replay: func(seed uint64) simrun.Run {
			s := replay(seed)
			return simrun.Run{Failed: s.failed, Trace: s.trace,
				About: fmt.Sprintf("CheckpointEvery %d, MaxInFlight %d, commits %v", s.every, s.inFlight, s.commits)}
		},
		Faults: fs,
	}
}

// TestSim runs the simulation over many seeds; a failing seed prints its
// trace's tail and replays with -seed.
func TestSim(t *testing.T) { flags.TestSim(t, theSim()) }

// faults are the checkpoint side's bugs fixed in the past, by name (see
// fault).
var faults = []struct {
	name  string
	fault faultKind
}{
	{"ResumeIgnoresMark", faultResumeIgnoresMark},
	{"ResumeUnwritten", faultResumeUnwritten},
	{"UnsureDrainUnwritten", faultUnsureDrainUnwritten},
	{"UnsureFailureStopsAtOnce", faultUnsureFailureStopsAtOnce},
	{"TransientRestarts", faultTransientRestarts},
	{"DrainUnwritten", faultDrainUnwritten},
	{"TickNotForced", faultTickNotForced},
	{"WritesOverlap", faultWritesOverlap},
	{"WrittenNotMax", faultWrittenNotMax},
}

// TestSimFindsTheFaults re-injects each of the checkpoint side's bugs
// fixed in the past, one at a time, and requires it found within the
// seeds TestSim runs: a bug it could not find would be a gap in the
// simulation.
func TestSimFindsTheFaults(t *testing.T) { flags.TestSimFindsTheFaults(t, theSim()) }
