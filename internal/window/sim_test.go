package window

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/simrun"
)

// The simulation: a bucket's events, of a few streams, some unreadable,
// go through the real State as a reader's window, under a seeded
// scheduler that plays the actor and the world around it:
//
//   - the handler answers current deliveries in any order — ack, retry
//     after a delay, panic, dead letter — or hangs (answers nothing,
//     probes included), or dies (its stop told to the window later);
//   - the clock moves and ticks; redeliveries fire in any order once due;
//     a replaced handler's successor spawns after a while;
//   - lease checks are answered at once or later, a few found unsure;
//   - dead-letter writes land or fail and are written again;
//   - drains start at random points; a drained window is followed by a
//     successor that starts at its finished prefix (the checkpoint);
//   - stale answers (of an earlier attempt, of a finished slot) are sent;
//   - a reader is stopped at once, and its successor starts at the
//     finished prefix with the retry State.Left leaves it.
//
// Invariants after every step: a Send comes only from a lease check's
// answer; nothing goes to a handler probed, replaced or known stopped;
// no unreadable event is sent, no finished one; an event is sent only
// when every earlier event of its stream is finished (per-stream order),
// and at most MaxInFlight events are sent and unfinished; the window
// holds at most MaxInFlight events; a handler is replaced only after a
// probe unanswered for ProbeWait or its stop, and always then; a dead
// letter for a spent budget comes only after MaxAttempts failures of the
// event's own, and every dead letter counts the attempts sent; the
// finished prefix covers only events acked or whose letter was written;
// a stale answer changes nothing; a drain ends only with nothing with the
// handler or the store, and, lease held, leaves events finished after
// an unfinished one only behind a retry it sent once and that failed
// again; a drain sends a retry at most once; a reader stopped at once
// leaves its first event, delivered and unfinished, with its attempts
// (each Send's Attempt counts the attempts sent before, across such
// stops). Then the faults stop, and
// every event must be finished.
//
//	go test -run TestSim ./internal/window/ -seed N   # replay one seed, with its trace
//	go test -run TestSim ./internal/window/ -seeds 100000

var flags = simrun.Register(2000)

// evLedger is what the simulation knows of one event in the current
// window.
type evLedger struct {
	fin          bool // acked, or its letter written
	sends        int  // attempts sent
	own          int  // failures of its own: retry, panic, timeout
	retried      bool // its last attempt failed
	drainResends int  // retries a drain sent
	letter       bool // a letter is out for it
	alone        bool // first of a batch that failed as a whole: sent alone until finished
}

type delivery struct {
	s      Send
	sentAt time.Time
	prog   *runProg // a run's, as its handler goes through it
}

// runProg is a run's progress on its handler.
type runProg struct {
	done      int
	committed bool
	inHand    bool
	since     time.Time // of the event in hand
	answered  bool      // the handler answered: next, or cut
	cut       bool
	next      Outcome
	unsure    bool
	cutReq    bool // the window asked to start no further event
}

// outcome is the run's outcome as the actor takes it (run.end).
func (p *runProg) outcome(d delivery) RunOutcome {
	return RunOutcome{Run: d.s.Run, Done: p.done, Committed: p.committed, InHand: p.inHand && !p.answered,
		Cut: !p.answered || p.cut, Next: p.next, Unsure: p.unsure}
}

// late reports whether the run's event in hand is late.
func (s *sim) late(d delivery) bool {
	p := d.prog
	return p.inHand && !p.answered && s.now.Sub(p.since) >= s.cfg.Timeout
}

type sim struct {
	rng     *rand.Rand
	cfg     Config
	w       *State
	now     time.Time
	events  []Event
	start   int // the current window's first event (its checkpoint)
	next    int // the next event to offer
	prefix  int // events of the window finished in its prefix
	led     map[int64]*evLedger
	ever    map[int64]bool
	out     []delivery // sent to the handler, current, unanswered
	history []delivery // every delivery sent
	timers  []Redelivery
	letters []Letter // being written
	failed  []Letter // failed, to be written again

	gen        uint64 // the machine's current handler as the simulation numbers it
	hung, dead bool
	told       bool // its stop told to the window
	replacing  bool
	respawnAt  time.Time
	probe      uint64
	probeAt    time.Time
	checking   bool
	draining   bool
	unsure     bool
	windows    int
	carry      *Event             // the retry a reader stopped at once left its successor
	gone       map[[2]uint64]bool // deliveries given up at this step
	poison     map[int64]bool     // events that break their batches while the faults last
	putBack    int                // events the window must put back at this step

	faults  bool
	steps   int
	tracing bool
	trace   []string
	broken  string
}

func newSim(seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	cfg := Config{
		MaxInFlight: []int{1, 2, 3, 5}[rng.IntN(4)],
		MaxAttempts: 2 + rng.IntN(3),
		Timeout:     100 * time.Millisecond,
		ProbeWait:   50 * time.Millisecond,
		Backoff:     func(n int) time.Duration { return time.Duration(n) * 10 * time.Millisecond },
	}
	switch rng.IntN(3) {
	case 1:
		cfg.MaxInFlight, cfg.MaxAttempts = 1, 1+rng.IntN(4)
		cfg.Batch.MaxEvents = 1 + rng.IntN(5)
		if rng.IntN(2) == 0 {
			cfg.Batch.MaxBytes = 8 + rng.IntN(20)
		}
	case 2:
		cfg.MaxInFlight, cfg.MaxAttempts, cfg.RunEvents = 1, 1+rng.IntN(4), 1+rng.IntN(5)
	}
	s := &sim{rng: rng, cfg: cfg, now: time.Unix(0, 0), faults: true, poison: map[int64]bool{}}
	streams := 1 + rng.IntN(4)
	n := 5 + rng.IntN(25)
	pos := int64(0)
	for range n {
		pos += 1 + int64(rng.IntN(3))
		e := Event{Pos: pos, Stream: fmt.Sprintf("s%d", rng.IntN(streams)), Size: 1 + rng.IntN(12)}
		if rng.IntN(20) == 0 {
			e.Err = errors.New("unreadable")
		}
		s.poison[pos] = rng.IntN(8) == 0
		s.events = append(s.events, e)
	}
	s.ever = map[int64]bool{}
	s.newWindow(nil)
	return s
}

// newWindow starts a window (a reader) at the first event not in the
// last one's finished prefix; carry, if not nil, is the retry its
// predecessor left, with what the simulation knows of it.
func (s *sim) newWindow(carry *Event) {
	s.windows++
	s.w = New(s.cfg)
	s.start += s.prefix
	s.next, s.prefix = s.start, 0
	old := s.led
	s.led = map[int64]*evLedger{}
	if s.carry = carry; carry != nil {
		l := old[carry.Pos]
		s.led[carry.Pos] = &evLedger{sends: l.sends, own: l.own, letter: carry.Letter != nil}
	}
	s.out, s.history, s.timers, s.letters, s.failed = nil, nil, nil, nil, nil
	s.gen, s.hung, s.dead, s.told, s.replacing = 1, false, false, false, false
	s.probe, s.checking, s.draining, s.unsure = 0, false, false, false
	s.log("window %d starts at event %d", s.windows, s.start)
}

func (s *sim) log(f string, a ...any) {
	if s.tracing {
		s.trace = append(s.trace, fmt.Sprintf("%6d %s", s.now.Sub(time.Unix(0, 0)).Milliseconds(), fmt.Sprintf(f, a...)))
	}
}

func (s *sim) fail(f string, a ...any) {
	if s.broken == "" {
		s.broken = fmt.Sprintf(f, a...)
		s.log("FAILED: %s", s.broken)
	}
}

func (s *sim) ev(pos int64) *evLedger {
	l := s.led[pos]
	if l == nil {
		l = &evLedger{}
		s.led[pos] = l
	}
	return l
}

func (s *sim) event(pos int64) Event {
	for _, e := range s.events {
		if e.Pos == pos {
			return e
		}
	}
	panic(pos)
}

// ready is whether the simulation lets a delivery go to the handler.
func (s *sim) ready() bool { return !s.replacing && s.probe == 0 && !(s.dead && s.told) }

// apply checks and carries out an input's effects; fromLease: the input
// was a lease check's answer held.
func (s *sim) apply(e Effects, fromLease, expectReplace bool) {
	if len(e.Sends) > 0 && !fromLease {
		s.fail("sent %+v without a lease check", e.Sends)
	}
	var ending *delivery
	if er := e.EndRun; er != nil {
		for _, d := range s.out {
			if d.s.Run == er.Run {
				ending = &d
			}
		}
		switch {
		case ending == nil:
			s.fail("asked to end run %d, not out", er.Run)
		case er.Late != s.late(*ending):
			s.fail("asked to end run %d late %v, its event in hand late %v", er.Run, er.Late, s.late(*ending))
		default:
			s.giveUp(*ending)
		}
	}
	if e.Replace != nil {
		for _, d := range s.out {
			if d.prog != nil && d.s.Handler == e.Replace.Old && !s.late(d) {
				s.fail("replaced handler %d, its run %d not ended", e.Replace.Old, d.s.Run)
			}
		}
	}
	if e.Replace != nil {
		if !expectReplace {
			s.fail("replaced handler %d, neither stopped nor unanswered to a probe", e.Replace.Old)
		}
		for _, d := range s.out {
			if d.prog == nil && d.s.Handler == e.Replace.Old && s.now.Sub(d.sentAt) < s.cfg.Timeout {
				s.giveUp(d) // sent again to the successor, uncharged
			}
		}
		s.replacing, s.probe = true, 0
		s.respawnAt = s.now.Add(time.Duration(s.rng.IntN(60)) * time.Millisecond)
		s.log("  replace handler %d (%d in a row)", e.Replace.Old, e.Replace.Fails)
	} else if expectReplace {
		s.fail("handler %d neither answered its probe nor is running, and is not replaced", s.gen)
	}
	for _, g := range e.GivenUp {
		k := [2]uint64{g.ID, uint64(g.Attempt)}
		if !s.gone[k] {
			s.fail("gave up #%d a%d, not late nor sent again", g.ID, g.Attempt)
		}
		delete(s.gone, k)
	}
	if len(s.gone) > 0 {
		s.fail("did not say it gave up %d deliveries", len(s.gone))
	}
	if f := e.Finished; f.Events > 0 {
		if f.Slots > f.Events || (!s.cfg.Batch.on() && s.cfg.RunEvents == 0 && f.Slots != f.Events) {
			s.fail("the finished prefix moves over %d slots and %d events", f.Slots, f.Events)
		}
		for i := range f.Events {
			k := s.start + s.prefix + i
			if k >= s.next {
				s.fail("the finished prefix passes the events taken")
				return
			}
			if !s.ev(s.events[k].Pos).fin {
				s.fail("the finished prefix passes event %d, unfinished", s.events[k].Pos)
			}
		}
		if last := s.events[s.start+s.prefix+f.Events-1].Pos; f.Through != last {
			s.fail("the finished prefix is through %d, its last event %d", f.Through, last)
		}
		s.prefix += f.Events
		s.log("  finished %d (%d slots) through %d", f.Events, f.Slots, f.Through)
	}
	if len(e.PutBack) != s.putBack {
		s.fail("put back %d events, %d to put back", len(e.PutBack), s.putBack)
	}
	for i, p := range e.PutBack {
		k := s.next - len(e.PutBack) + i
		if k < s.start+s.prefix || s.events[k].Pos != p.Pos {
			s.fail("put back %v, not the last events taken", e.PutBack)
			break
		}
		if s.ev(p.Pos).fin {
			s.fail("put back event %d, finished", p.Pos)
		}
	}
	s.next -= len(e.PutBack)
	s.putBack = 0
	if e.Absorbed > 0 && !fromLease {
		s.fail("absorbed %d pending events without a lease check", e.Absorbed)
	}
	for _, l := range e.Letters {
		led := s.ev(l.Pos)
		want := led.sends
		if s.event(l.Pos).Err != nil {
			want = 0
		}
		if l.Attempts != want {
			s.fail("dead letter of %d counts %d attempts, %d sent", l.Pos, l.Attempts, want)
		}
		if l.Budget && led.own < s.cfg.MaxAttempts {
			s.fail("event %d dead-lettered for its budget after %d failures of its own (budget %d)", l.Pos, led.own, s.cfg.MaxAttempts)
		}
		if led.fin {
			s.fail("dead-lettered event %d, finished", l.Pos)
		}
		led.letter = true
		s.letters = append(s.letters, l)
		s.log("  letter %d (%s)", l.Pos, l.Reason)
	}
	for _, r := range e.Redeliver {
		for _, d := range s.history {
			if l := s.ev(d.s.Pos); d.s.ID == r.ID && l.own >= s.cfg.MaxAttempts {
				s.fail("event %d retried after %d failures of its own (budget %d)", d.s.Pos, l.own, s.cfg.MaxAttempts)
				break
			}
		}
		s.timers = append(s.timers, r)
	}
	if e.Probe != 0 {
		s.probe, s.probeAt = e.Probe, s.now
		s.log("  probe %d", e.Probe)
	}
	absorbed := 0
	for _, d := range e.Sends {
		s.sent(d, &absorbed)
	}
	if absorbed != e.Absorbed {
		s.fail("the batches sent took %d pending events, Absorbed says %d", absorbed, e.Absorbed)
	}
	if e.CheckLease {
		s.checking = true
	}
	if e.SpawnNow {
		if !s.replacing {
			s.fail("asked to spawn a handler while handler %d runs", s.gen)
		}
		s.respawnAt = s.now
		s.log("  spawn now")
	}
	if e.CutRun {
		for _, d := range s.out {
			if d.prog != nil {
				d.prog.cutReq = true
			}
		}
	}
	if s.draining {
		for _, d := range s.out {
			if d.prog != nil && !d.prog.cutReq && !d.prog.answered {
				s.fail("a drain leaves run %d going", d.s.Run)
			}
		}
	}
	if ending != nil {
		s.endRun(*ending, e.EndRun.Late)
	}
	if e.Drained {
		s.drained()
	}
}

// endRun ends a run the window asked to end, and gives it its outcome.
func (s *sim) endRun(d delivery, late bool) {
	o := d.prog.outcome(d)
	s.runLedger(d, o, late)
	e := s.w.RunEnded(s.now, o)
	s.log("end run %d %+v late %v: %s", d.s.Run, o, late, s.w)
	s.apply(e, false, false)
}

// runLedger records a run's outcome: its done events finished, the first
// not done the slot's, at the attempts the window gives it. late: the
// reader ended it on its event in hand's timeout.
func (s *sim) runLedger(d delivery, o RunOutcome, late bool) {
	evs := d.s.Events
	for _, e := range evs[:o.Done] {
		s.finish(e.Pos)
	}
	if o.Done >= len(evs) {
		return
	}
	s.putBack = len(evs) - o.Done - 1
	head := s.ev(evs[o.Done].Pos)
	started := o.InHand || !o.Cut
	switch {
	case o.Done > 0 && started:
		head.sends = 1 // the run was its first attempt
	case o.Done > 0:
		head.sends = 0
	case !started:
		head.sends-- // not handled: sent again at the same attempt
	}
	switch {
	case late && o.InHand:
		head.own++
		head.retried = true
	case !o.Cut && (o.Next == Retry || o.Next == Panicked):
		if late || d.prog.answered {
			head.own++
			head.retried = true
		}
	}
}

// stepRun has a run's handler take its next step: start an event, finish
// the one in hand, answer; a hung handler hangs in its next event.
func (s *sim) stepRun(d delivery) {
	p := d.prog
	if p.answered {
		s.deliverRun(d) // its answer, sent before it hung, arrives
		return
	}
	if s.hung {
		if !p.inHand {
			p.inHand, p.since = true, s.now
		}
		return
	}
	n := len(d.s.Events)
	if !p.inHand {
		switch {
		case p.cutReq, p.done > 0 && s.faults && s.rng.IntN(6) == 0:
			p.answered, p.cut = true, true // cut short, its time slice spent, or the resize bound
		case s.faults && s.rng.IntN(40) == 0:
			p.answered, p.cut, p.unsure = true, true, true // EnsureHeld failed
		default:
			p.inHand, p.since = true, s.now
			s.log("run %d starts %d", d.s.Run, d.s.Events[p.done].Pos)
			return
		}
	} else {
		p.inHand = false
		o := Acked
		if s.faults {
			o = []Outcome{Acked, Acked, Acked, Acked, Retry, Panicked, DeadLettered}[s.rng.IntN(7)]
		}
		if o == Acked {
			p.done++
			p.committed = s.rng.IntN(5) == 0
			p.answered = p.done == n
		} else {
			p.next, p.answered = o, true
		}
		s.log("run %d: %d done, next %v answered %v", d.s.Run, p.done, p.next, p.answered)
	}
	if p.answered && s.rng.IntN(2) == 0 {
		s.deliverRun(d)
	}
}

// deliverRun gives the window a run's answer.
func (s *sim) deliverRun(d delivery) {
	s.out = without(s.out, d)
	o := d.prog.outcome(d)
	s.runLedger(d, o, false)
	committed := int64(0)
	if o.Committed && o.Done > 0 {
		committed = d.s.Events[o.Done-1].Pos
	}
	e := s.w.RunAnswered(s.now, o)
	s.log("run answer %v %+v: %s", poss(d.s.Events), o, s.w)
	if e.Finished.Committed != committed {
		s.fail("a run's answer %+v reports committed %d, not %d", o, e.Finished.Committed, committed)
	}
	if o.Unsure {
		s.draining, s.unsure, s.checking = true, true, false
	}
	s.apply(e, false, false)
}

func (s *sim) sent(d Send, absorbed *int) {
	s.log("  send %d#%d a%d f%d to %d %v", d.Pos, d.ID, d.Attempt, d.Free, d.Handler, poss(d.Events))
	if s.cfg.Batch.on() || d.Run != 0 {
		s.sentBatch(d, absorbed)
	}
	if !s.ready() {
		s.fail("sent %d to a handler not ready (replacing %v, probe %d, stopped %v)", d.Pos, s.replacing, s.probe, s.dead && s.told)
	}
	if d.Handler != s.gen {
		s.fail("sent %d to handler %d, not the current %d", d.Pos, d.Handler, s.gen)
	}
	e := s.event(d.Pos)
	if e.Err != nil {
		s.fail("sent unreadable event %d to the handler", d.Pos)
	}
	led := s.ev(d.Pos)
	if led.fin {
		s.fail("sent event %d, finished", d.Pos)
	}
	unfinished := map[int64]bool{}
	for k := s.start; k < s.next; k++ {
		o := s.events[k]
		if o.Pos < d.Pos && o.Stream == e.Stream && !s.ev(o.Pos).fin {
			s.fail("sent %d while %d of its stream %s is unfinished", d.Pos, o.Pos, e.Stream)
		}
	}
	for _, o := range s.out {
		if o.s.Pos == d.Pos {
			s.fail("sent %d again while attempt %d is out", d.Pos, o.s.Attempt)
		}
	}
	for k := s.start; k < s.next; k++ {
		p := s.events[k].Pos
		if l := s.led[p]; (l != nil && l.sends > 0 && !l.fin) || p == d.Pos {
			unfinished[p] = true
		}
	}
	if len(unfinished) > s.cfg.MaxInFlight {
		s.fail("%d events sent and unfinished, MaxInFlight %d", len(unfinished), s.cfg.MaxInFlight)
	}
	if s.draining && led.retried {
		led.drainResends++
		if led.drainResends > 1 {
			s.fail("the drain sent the retry of %d twice", d.Pos)
		}
	}
	if d.Attempt != led.sends {
		s.fail("sent %d as attempt %d, its attempt %d", d.Pos, d.Attempt, led.sends)
	}
	led.sends++
	led.retried = false
	if len(d.Events) > 1 && led.alone {
		s.fail("sent %d, the first of a batch that failed as a whole, in a batch of %d", d.Pos, len(d.Events))
	}
	dl := delivery{s: d, sentAt: s.now}
	if d.Run != 0 {
		dl.prog = &runProg{since: s.now}
	}
	s.out = append(s.out, dl)
	s.history = append(s.history, dl)
}

// sentBatch checks a batch sent: its first event the slot's, then the
// pending events in order, as many as its bounds let in, none unreadable,
// none finished; it takes them.
func (s *sim) sentBatch(d Send, absorbed *int) {
	b := s.cfg.Batch
	if len(d.Events) == 0 || d.Events[0].Pos != d.Pos {
		s.fail("a batch sent as %+v", d)
		return
	}
	limit := b.MaxEvents
	if s.ev(d.Pos).alone {
		limit = 1
	}
	if d.Run != 0 {
		limit = s.cfg.RunEvents
	}
	if len(d.Events) > limit {
		s.fail("a batch of %d events, at most %d", len(d.Events), limit)
	}
	size := d.Events[0].Size
	for i, e := range d.Events[1:] {
		k := s.next + *absorbed + i
		if k >= len(s.events) || s.events[k].Pos != e.Pos {
			s.fail("a batch takes %d, not the next pending event", e.Pos)
			return
		}
		if e.Err != nil {
			s.fail("a batch takes unreadable event %d", e.Pos)
		}
		if s.ev(e.Pos).fin {
			s.fail("a batch takes event %d, finished", e.Pos)
		}
		if size += e.Size; b.MaxBytes > 0 && size > b.MaxBytes {
			s.fail("a batch of %d bytes, at most %d", size, b.MaxBytes)
		}
	}
	n := len(d.Events) - 1
	if k := s.next + *absorbed + n; len(d.Events) < limit && k < len(s.events) {
		if e := s.events[k]; e.Err == nil && (b.MaxBytes == 0 || size+e.Size <= b.MaxBytes) {
			s.fail("a batch of %d events leaves out %d, which fits", len(d.Events), e.Pos)
		}
	}
	*absorbed += n
	s.next += n
}

func (s *sim) drained() {
	s.log("  drained")
	if !s.draining {
		s.fail("drained without a drain")
	}
	if len(s.out) > 0 || len(s.letters) > 0 || len(s.failed) > 0 {
		s.fail("drained with %d deliveries and %d letters out", len(s.out), len(s.letters)+len(s.failed))
	}
	if !s.unsure {
		first := -1
		for k := s.start + s.prefix; k < s.next; k++ {
			l := s.ev(s.events[k].Pos)
			if first < 0 && !l.fin {
				first = k
			}
			if first >= 0 && l.fin {
				f := s.ev(s.events[first].Pos)
				if f.drainResends != 1 || !f.retried {
					s.fail("the drain left %d unfinished with %d finished after it (the next owner repeats it)",
						s.events[first].Pos, s.events[k].Pos)
				}
				break
			}
		}
	}
	for k := s.start; k < s.next; k++ {
		if p := s.events[k].Pos; s.ev(p).fin {
			s.ever[p] = true
		}
	}
	s.newWindow(nil)
}

// giveUp drops a delivery the window must say it gave up (late, or
// sent again to a successor).
func (s *sim) giveUp(d delivery) {
	s.out = without(s.out, d)
	s.gone[[2]uint64{d.s.ID, uint64(d.s.Attempt)}] = true
	if d.prog == nil {
		s.putBack += max(len(d.s.Events)-1, 0)
	}
}

// failedWhole records a batch's failure as a whole (or a single
// delivery's failure): its first event goes alone next; the failure is
// its own only if it was alone (a batch's says nothing of which event
// broke it).
func (s *sim) failedWhole(d delivery) {
	l := s.ev(d.s.Pos)
	l.retried = true
	if len(d.s.Events) > 1 {
		l.alone = true
		return
	}
	l.own++
}

// finish records an event acked, once.
func (s *sim) finish(pos int64) {
	l := s.ev(pos)
	if l.fin {
		s.fail("event %d finished twice", pos)
	}
	l.fin = true
}

// answerBatch has the handler answer a batch: all done, a prefix done and
// an answer for the next, or a failure as a whole (a panic, a Retry, a
// wrong answer, a BatchAck outside the batch). A poison event breaks its
// batches while the faults last.
func (s *sim) answerBatch(d delivery) {
	n := len(d.s.Events)
	a := Answer{ID: d.s.ID, Attempt: d.s.Attempt, Outcome: BatchAcked, Done: n}
	if s.faults {
		a.After = time.Duration(s.rng.IntN(50)) * time.Millisecond
		a.Committed, a.NextCommitted = s.rng.IntN(5) == 0, s.rng.IntN(5) == 0
		poison := -1
		for i, e := range d.s.Events {
			if s.poison[e.Pos] && poison < 0 {
				poison = i
			}
		}
		switch r := s.rng.IntN(8); {
		case poison >= 0 && r < 5:
			a.Outcome = []Outcome{Panicked, Retry}[s.rng.IntN(2)]
		case poison >= 0 && r < 7:
			a.Done, a.Next = poison, Retry
		case r < 3:
		case r < 5:
			a.Done, a.Next = s.rng.IntN(n), []Outcome{Acked, Retry, DeadLettered}[s.rng.IntN(3)]
		case r < 7:
			a.Outcome = []Outcome{Retry, Panicked, Acked, DeadLettered}[s.rng.IntN(4)]
		default:
			a.Done = []int{-1, n + 1}[s.rng.IntN(2)]
		}
	}
	committed := int64(0)
	switch {
	case a.Outcome != BatchAcked || a.Done < 0 || a.Done > n:
		s.failedWhole(d)
		s.putBack = n - 1
	case a.Done == n:
		for _, e := range d.s.Events {
			s.finish(e.Pos)
		}
		if a.Committed {
			committed = d.s.Events[n-1].Pos
		}
	default:
		for _, e := range d.s.Events[:a.Done] {
			s.finish(e.Pos)
		}
		head := s.ev(d.s.Events[a.Done].Pos)
		if a.Done > 0 {
			head.sends = 1 // the batch was its first attempt
			if a.Committed {
				committed = d.s.Events[a.Done-1].Pos
			}
		}
		switch a.Next {
		case Acked:
			s.finish(d.s.Events[a.Done].Pos)
			if a.NextCommitted {
				committed = d.s.Events[a.Done].Pos
			}
		case Retry:
			head.own++
			head.retried = true
		}
		s.putBack = n - a.Done - 1
	}
	e := s.w.Answered(s.now, a)
	s.log("answer %v#%d a%d %s done %d next %s: %s", poss(d.s.Events), d.s.ID, d.s.Attempt, a.Outcome, a.Done, a.Next, s.w)
	if e.Finished.Committed != committed {
		s.fail("a batch's answer %+v reports committed %d, not %d", a, e.Finished.Committed, committed)
	}
	s.apply(e, false, false)
}

func without(ds []delivery, d delivery) []delivery {
	out := ds[:0:0]
	for _, o := range ds {
		if o.s.ID != d.s.ID || o.s.Attempt != d.s.Attempt {
			out = append(out, o)
		}
	}
	return out
}

// step runs one step; false once everything is finished (faults off).
func (s *sim) step() bool {
	s.steps++
	s.gone = map[[2]uint64]bool{}
	if !s.faults && s.next == len(s.events) && s.w.Len() == 0 && !s.checking {
		return false
	}
	expect := false
	for {
		switch s.rng.IntN(15) {
		case 0: // events come
			if s.next == len(s.events) || s.draining {
				continue
			}
			k := min(len(s.events), s.next+1+s.rng.IntN(3))
			offer := append([]Event(nil), s.events[s.next:k]...)
			if c := s.carry; c != nil && offer[0].Pos == c.Pos {
				offer[0] = *c
			}
			n, e := s.w.Take(offer)
			if n > 0 {
				s.carry = nil
			}
			s.log("take %d of %d: %s", n, k-s.next, s.w)
			s.next += n
			if held := s.next - s.start - s.prefix; s.w.Len() > s.cfg.MaxInFlight || (!s.cfg.Batch.on() && s.cfg.RunEvents == 0 && held > s.cfg.MaxInFlight) {
				s.fail("the window holds %d events in %d slots, MaxInFlight %d", held, s.w.Len(), s.cfg.MaxInFlight)
			}
			s.apply(e, false, false)
		case 1, 2: // a lease check answered
			if !s.checking {
				continue
			}
			held := !s.faults || s.rng.IntN(40) != 0
			s.checking = false
			e := s.w.Lease(s.now, held, append([]Event(nil), s.events[s.next:]...))
			if !held {
				s.draining, s.unsure = true, true
			}
			s.log("lease held %v: %s", held, s.w)
			s.apply(e, held, false)
		case 3, 4: // the handler answers
			if len(s.out) == 0 || s.dead {
				continue
			}
			d := s.out[s.rng.IntN(len(s.out))]
			if d.s.Handler != s.gen {
				continue
			}
			if d.prog != nil {
				s.stepRun(d)
				break
			}
			if s.hung {
				continue
			}
			s.out = without(s.out, d)
			if d.s.Events != nil {
				s.answerBatch(d)
				break
			}
			a := Answer{ID: d.s.ID, Attempt: d.s.Attempt, Outcome: Acked, Runs: s.cfg.RunEvents > 0}
			if s.faults {
				a.Outcome = []Outcome{Acked, Acked, Acked, Retry, Retry, Panicked, DeadLettered}[s.rng.IntN(7)]
				a.After = time.Duration(s.rng.IntN(50)) * time.Millisecond
			}
			led := s.ev(d.s.Pos)
			switch a.Outcome {
			case Acked:
				led.fin = true
			case Retry, Panicked:
				led.own++
				led.retried = true
			}
			a.Committed = a.Outcome == Acked && s.rng.IntN(5) == 0
			e := s.w.Answered(s.now, a)
			s.log("answer %d#%d a%d %s: %s", d.s.Pos, d.s.ID, d.s.Attempt, a.Outcome, s.w)
			if a.Committed != (e.Finished.Committed == d.s.Pos) {
				s.fail("an ack committed %v of %d reports committed %d", a.Committed, d.s.Pos, e.Finished.Committed)
			}
			s.apply(e, false, false)
		case 5: // time passes; the timer ticks
			s.now = s.now.Add(time.Duration(1+s.rng.IntN(40)) * time.Millisecond)
			if s.probe != 0 && s.now.Sub(s.probeAt) >= s.cfg.ProbeWait {
				expect = true
				for _, d := range s.out {
					if d.prog == nil && d.s.Handler == s.gen && s.now.Sub(d.sentAt) < s.cfg.Timeout {
						s.giveUp(d)
					}
				}
			}
			lateRun := false
			for _, d := range s.out {
				if d.prog != nil {
					s.w.RunProgress(d.prog.since, d.prog.inHand && !d.prog.answered)
					lateRun = lateRun || s.late(d)
					continue
				}
				if s.now.Sub(d.sentAt) >= s.cfg.Timeout {
					s.giveUp(d)
					s.failedWhole(d)
				}
			}
			e := s.w.Tick(s.now)
			s.log("tick: %s", s.w)
			if lateRun && (e.EndRun == nil || !e.EndRun.Late) {
				s.fail("a run's event in hand is late and the run not ended")
			}
			s.apply(e, false, expect)
		case 6: // a redelivery is due
			var due []Redelivery
			for _, r := range s.timers {
				if !r.At.After(s.now) {
					due = append(due, r)
				}
			}
			if len(due) == 0 {
				continue
			}
			r := due[s.rng.IntN(len(due))]
			kept := s.timers[:0:0]
			for _, o := range s.timers {
				if o != r {
					kept = append(kept, o)
				}
			}
			s.timers = kept
			e := s.w.Redeliver(s.now, r.ID, r.Attempt)
			s.log("redeliver #%d a%d: %s", r.ID, r.Attempt, s.w)
			s.apply(e, false, false)
		case 7: // a dead letter is written, or fails
			if len(s.letters) == 0 {
				continue
			}
			i := s.rng.IntN(len(s.letters))
			l := s.letters[i]
			s.letters = append(s.letters[:i:i], s.letters[i+1:]...)
			if s.faults && s.rng.IntN(3) == 0 {
				s.failed = append(s.failed, l)
				e := s.w.LetterFailed(l.ID)
				s.log("letter %d fails: %s", l.Pos, s.w)
				s.apply(e, false, false)
				break
			}
			s.ev(l.Pos).fin = true
			e := s.w.LetterWritten(l.ID)
			s.log("letter %d written: %s", l.Pos, s.w)
			s.apply(e, false, false)
		case 8: // a failed letter is written again
			if len(s.failed) == 0 {
				continue
			}
			l := s.failed[0]
			s.failed = s.failed[1:]
			e := s.w.RewriteLetter(l.ID)
			s.log("rewrite letter %d: %s", l.Pos, s.w)
			if len(e.Letters) != 1 {
				s.fail("a failed letter is not written again")
			}
			s.letters = append(s.letters, e.Letters...)
		case 9: // the handler answers its probe, or spawns again
			if s.replacing && !s.now.Before(s.respawnAt) {
				s.replacing, s.hung, s.dead, s.told = false, false, false, false
				s.gen++
				e := s.w.HandlerSpawned()
				s.log("handler %d spawned: %s", s.gen, s.w)
				s.apply(e, false, false)
				break
			}
			if s.probe == 0 || s.hung || s.dead {
				continue
			}
			p := s.probe
			s.probe = 0
			e := s.w.ProbeAnswered(p)
			s.log("probe %d answered: %s", p, s.w)
			s.apply(e, false, false)
		case 10: // the handler hangs, dies, or its stop is told
			if s.replacing {
				continue
			}
			if s.dead && !s.told {
				s.told = true
				for _, d := range s.out {
					if d.prog != nil {
						s.w.RunProgress(d.prog.since, d.prog.inHand && !d.prog.answered)
					} else if d.s.Handler == s.gen && s.now.Sub(d.sentAt) < s.cfg.Timeout {
						s.giveUp(d)
					}
				}
				e := s.w.HandlerStopped(s.now, s.gen)
				s.log("handler %d stopped: %s", s.gen, s.w)
				s.apply(e, false, true)
				break
			}
			if !s.faults || s.hung || s.dead || s.rng.IntN(4) != 0 {
				continue
			}
			if s.rng.IntN(2) == 0 {
				s.hung = true
				s.log("handler %d hangs", s.gen)
			} else {
				s.dead = true
				s.log("handler %d dies", s.gen)
			}
		case 11: // a drain
			if !s.faults || s.draining || s.rng.IntN(8) != 0 {
				continue
			}
			s.draining = true
			e := s.w.Drain()
			s.log("drain: %s", s.w)
			s.apply(e, false, false)
		case 12: // a stale answer
			if len(s.history) == 0 {
				continue
			}
			d := s.history[s.rng.IntN(len(s.history))]
			current := false
			for _, o := range s.out {
				current = current || (o.s.ID == d.s.ID && o.s.Attempt == d.s.Attempt)
			}
			if current {
				continue
			}
			before := s.w.String()
			e := s.w.Answered(s.now, Answer{ID: d.s.ID, Attempt: d.s.Attempt, Outcome: Outcome(s.rng.IntN(5)), Done: s.rng.IntN(3)})
			if after := s.w.String(); after != before || !reflect.DeepEqual(e, Effects{}) {
				s.fail("a stale answer to %d#%d a%d changed the window: %s -> %s, %+v", d.s.Pos, d.s.ID, d.s.Attempt, before, after, e)
			}
		case 14: // the reader is stopped at once (a restart), and its successor starts at its prefix
			if !s.faults || s.rng.IntN(10) != 0 {
				continue
			}
			if s.leftRun() {
				break
			}
			left, ok := s.w.Left()
			var want *evLedger
			if k := s.start + s.prefix; k < s.next {
				if l := s.ev(s.events[k].Pos); (l.sends > 0 || l.letter) && !l.fin {
					want = l
				}
			}
			switch {
			case want != nil && !ok:
				s.fail("a reader stopped at once leaves no retry of event %d, delivered %d times", s.events[s.start+s.prefix].Pos, want.sends)
			case want == nil && ok:
				s.fail("a reader stopped at once leaves %+v, not delivered or finished", left)
			case ok && want.letter != (left.Letter != nil):
				s.fail("a reader stopped at once leaves event %d with letter %v, its letter being written %v", left.Pos, left.Letter, want.letter)
			case ok && left.Letter == nil && left.Attempt != want.sends:
				s.fail("a reader stopped at once leaves event %d at attempt %d, delivered %d times", left.Pos, left.Attempt, want.sends)
			}
			s.log("restart: %s leaves %+v %v", s.w, left, ok)
			for k := s.start; k < s.next; k++ {
				if p := s.events[k].Pos; s.ev(p).fin {
					s.ever[p] = true
				}
			}
			if s.carry != nil && !ok {
				ok, left = true, *s.carry // not taken yet: passed on
			}
			if ok {
				s.newWindow(&left)
			} else {
				s.newWindow(nil)
			}
		case 13: // the clock jumps
			s.now = s.now.Add(time.Duration(s.rng.IntN(150)) * time.Millisecond)
			continue
		}
		return true
	}
}

// leftRun stops the reader at once with a run in flight, if one is, and
// starts its successor after the run's done events with what LeftRun
// leaves.
func (s *sim) leftRun() bool {
	var d *delivery
	for _, o := range s.out {
		if o.prog != nil {
			d = &o
		}
	}
	if d == nil {
		return false
	}
	o := d.prog.outcome(*d)
	left, ok, done := s.w.LeftRun(o)
	s.log("restart: %s leaves %+v %v after %d done of run %d", s.w, left, ok, done, d.s.Run)
	evs := d.s.Events
	if done != o.Done {
		s.fail("a reader stopped at once with a run %d done says %d done", o.Done, done)
		return true
	}
	for _, e := range evs[:done] {
		s.finish(e.Pos)
	}
	s.prefix += done
	started := o.InHand || !o.Cut
	// One not started is left only if it is a retry: the run's first
	// event, sent at an attempt above 0, left at that attempt.
	want := done < len(evs) && (started || (done == 0 && d.s.Attempt > 0))
	sends := s.ev(evs[min(done, len(evs)-1)].Pos).sends
	if !started {
		sends = d.s.Attempt
	}
	switch {
	case want != ok:
		s.fail("a reader stopped at once with run %+v leaves %v, want %v", o, ok, want)
	case ok && left.Pos != evs[done].Pos:
		s.fail("a reader stopped at once with run %+v leaves event %d", o, left.Pos)
	case ok && done > 0 && left.Attempt != 1:
		s.fail("a reader stopped at once leaves the head %d of a run at attempt %d, not 1", left.Pos, left.Attempt)
	case ok && done == 0 && left.Attempt != sends:
		s.fail("a reader stopped at once leaves event %d at attempt %d, delivered %d times", left.Pos, left.Attempt, sends)
	}
	if ok {
		s.ev(left.Pos).sends = left.Attempt
	}
	for k := s.start; k < s.next; k++ {
		if p := s.events[k].Pos; s.ev(p).fin {
			s.ever[p] = true
		}
	}
	if ok {
		s.newWindow(&left)
	} else {
		s.newWindow(nil)
	}
	return true
}

func (s *sim) run() string {
	for range 60 + s.rng.IntN(300) {
		s.step()
		if s.broken != "" {
			return s.broken
		}
	}
	s.faults = false
	s.log("the faults stop")
	for s.step() {
		if s.broken != "" {
			return s.broken
		}
		if s.steps > 50000 {
			s.fail("no end after %d steps: %s", s.steps, s.w)
			return s.broken
		}
	}
	for k := s.start; k < s.next; k++ {
		if p := s.events[k].Pos; s.ev(p).fin {
			s.ever[p] = true
		}
	}
	for _, e := range s.events {
		if !s.ever[e.Pos] {
			s.fail("lost: event %d never finished", e.Pos)
			break
		}
	}
	return s.broken
}

func replay(seed uint64) *sim {
	s := newSim(seed)
	s.tracing = true
	s.broken = s.run()
	return s
}

func theSim() simrun.Sim {
	var fs []simrun.Fault
	for _, m := range faults {
		f := simrun.Switch(m.name, &fault, m.fault, faultNone)
		f.Seeds = m.seeds
		fs = append(fs, f)
	}
	return simrun.Sim{
		Check: func(seed uint64) string { return newSim(seed).run() },
		Replay: func(seed uint64) simrun.Run {
			s := replay(seed)
			return simrun.Run{Failed: s.broken, Trace: s.trace,
				About: fmt.Sprintf("MaxInFlight %d, MaxAttempts %d, %d events", s.cfg.MaxInFlight, s.cfg.MaxAttempts, len(s.events))}
		},
		Faults: fs,
	}
}

// TestSim runs the simulation over many seeds; a failing seed prints its
// trace's tail and replays with -seed.
func TestSim(t *testing.T) { flags.TestSim(t, theSim()) }

// faults are the window's past bugs, and mutations of its rules, by name
// (see fault).
var faults = []struct {
	name  string
	fault faultKind
	seeds int // more than -seeds: a fault only a rare schedule shows
}{
	{name: "RetryUnchecked", fault: faultRetryUnchecked},
	{name: "LateReplaces", fault: faultLateReplaces},
	{name: "SendWhileProbing", fault: faultSendWhileProbing},
	{name: "StoppedIgnored", fault: faultStoppedIgnored},
	{name: "FreeNotGiven", fault: faultFreeNotGiven},
	{name: "FreeCharged", fault: faultFreeCharged},
	{name: "DrainLeavesRetries", fault: faultDrainLeavesRetries},
	{name: "DrainResendsForEver", fault: faultDrainResendsForEver},
	{name: "UnreadableSent", fault: faultUnreadableSent},
	{name: "AttemptIgnored", fault: faultAttemptIgnored},
	{name: "StreamJump", fault: faultStreamJump},
	{name: "OverAdmits", fault: faultOverAdmits},
	{name: "PrefixSkips", fault: faultPrefixSkips},
	{name: "LetterFailureFinishes", fault: faultLetterFailureFinishes},
	{name: "DrainEndsEarly", fault: faultDrainEndsEarly},
	{name: "TimeoutUncharged", fault: faultTimeoutUncharged},
	{name: "ProbeAnswerIgnored", fault: faultProbeAnswerIgnored},
	{name: "DrainEndsUnready", fault: faultDrainEndsUnready},
	{name: "LeftLetterForgotten", fault: faultLeftLetterForgotten},
	{name: "DueNotOnDrain", fault: faultDueNotOnDrain},
	{name: "LeftForgotten", fault: faultLeftForgotten},
	{name: "LeftCharged", fault: faultLeftCharged},
	{name: "BudgetOverspent", fault: faultBudgetOverspent},
	{name: "NotAlone", fault: faultNotAlone},
	{name: "WholeFailureCharged", fault: faultWholeFailureCharged},
	{name: "BatchTakesUnreadable", fault: faultBatchTakesUnreadable},
	{name: "BatchBytesIgnored", fault: faultBatchBytesIgnored},
	{name: "PutBackLost", fault: faultPutBackLost},
	{name: "HeadKeepsAttempts", fault: faultHeadKeepsAttempts},
	{name: "RunTakesOneMore", fault: faultRunTakesOneMore},
	{name: "RunNotCut", fault: faultRunNotCut},
	{name: "RunLeftKeepsAttempts", fault: faultRunLeftKeepsAttempts},
	{name: "RunLeftForgetsUnstarted", fault: faultRunLeftForgetsUnstarted},
	// A run answered as its handler is replaced: the handler must die
	// with the run's answer on its way, a Retry or a panic, and the
	// event go on to spend its budget.
	{name: "RunAnswerFree", fault: faultRunAnswerFree, seeds: 8000},
}

// TestSimFindsTheFaults re-injects each fault, one at a time, and
// requires it found within the seeds TestSim runs.
func TestSimFindsTheFaults(t *testing.T) { flags.TestSimFindsTheFaults(t, theSim()) }
