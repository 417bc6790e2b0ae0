package resizepart

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kumi-run/kumi/internal/simrun"
)

// The simulation: one worker's coordinator and the readers of a
// subscription's serving generation, built from the real Part, against a
// simulated resize and lease store that follows docs/design/resize.md — requests,
// proposals (the largest decides the cut), drains fenced by epoch, cancels
// in every state, a second resize right after a cancel, completion —
// under a seeded scheduler that runs every message, answer and pass
// result late and in any order, and loses leases. Invariants are checked
// after every step; then the faults stop and every resize must end.
//
//	go test -run TestSim ./internal/resizepart/ -seed N   # replay one seed, with its trace
//	go test -run TestSim ./internal/resizepart/ -seeds 100000

var flags = simrun.Register(2000)

// mutation re-injects a fault the simulation must find (0: none); set only
// by TestSimFindsTheFaults, never by the code.
var mutation int

const (
	mutNone = iota
	// mutDrainedBySlot: the coordinator knows a drained slot by its number
	// alone (issue 24, fault 1).
	mutDrainedBySlot
	// mutSealIgnoredWhileBounded: a reader bounded by a cut ignores a seal,
	// and the coordinator tells a change once (fault 2).
	mutSealIgnoredWhileBounded
	// mutAnswerThenOlderTold: the store proposes for whichever resize is in
	// force, and the reader applies what it was told while its proposal was
	// out after the answer, whatever its age (fault 3).
	mutAnswerThenOlderTold
	// mutAnswerOverridesToldOnce: a proposal's answer replaces everything
	// the reader knows, newer news told while it was out included, and the
	// coordinator tells a reader a change once (edge-triggered). Either
	// alone is no fault (the first found in none of 20,000 seeds, the
	// second in none of 2,000): an answer is true
	// news of the resize proposed for, and what it replaces is news the
	// next pass tells again (see Part.Proposal); a reader told each change
	// once loses none with the answer merged. Together, the news replaced
	// is never told again: the reader never proposes for the resize in
	// force, which never ends.
	mutAnswerOverridesToldOnce
)

// toldOnce: the mutation's coordinator tells a change once.
func toldOnce() bool {
	return mutation == mutSealIgnoredWhileBounded || mutation == mutAnswerOverridesToldOnce
}

// simSlot is a lease row of the serving generation.
type simSlot struct {
	epoch      int64
	held       bool // by this worker (a drained slot is held by nobody)
	proposal   int64
	proposed   bool
	drained    bool
	checkpoint int64
}

// simReader is one reader incarnation.
type simReader struct {
	slot, gen  int
	epoch      int64
	part       Part
	cursor     int64 // read through
	delivered  int64 // delivered through (its bucket's events)
	dead       bool
	toldDuring *Told // mutAnswerThenOlderTold: the last told while proposing
	lastTold   Told  // toldOnce: edge-triggered telling
	toldOnce   bool
}

// simMsg is a message, answer or pass result under way; what it is is
// formatted only when traced.
type simMsg struct {
	format string
	args   []any
	run    func()
}

type sim struct {
	t       testing.TB
	rng     *rand.Rand
	tracing bool // trace every step (a failing seed is run again with it)
	trace   []string
	failed  string

	// the store
	gen      int
	n        int
	head     int64
	id       int64 // the resize in force, or the last
	resizing bool
	decided  bool
	cut      int64
	slots    []*simSlot
	// maxDelivered[gen][slot] is the furthest any reader of the slot
	// delivered; endAt[gen] the cut a generation ended at.
	maxDelivered map[int][]int64
	endAt        map[int]int64
	checkpoints  map[int][]int64 // the last checkpoint seen, by generation and slot

	// the coordinator
	readers map[int]*simReader // by slot
	drained map[int]int64      // slot → epoch drained at
	owned   map[int]int64      // slot → epoch

	inflight []simMsg
	steps    int
	passing  bool // a pass is under way: the coordinator runs one at a time
}

func newSim(t testing.TB, seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &sim{t: t, rng: rng, n: 1 + rng.IntN(3), readers: map[int]*simReader{}, drained: map[int]int64{},
		owned: map[int]int64{}, maxDelivered: map[int][]int64{}, endAt: map[int]int64{},
		checkpoints: map[int][]int64{}}
	s.newGeneration(0)
	return s
}

func (s *sim) log(format string, args ...any) {
	if !s.tracing {
		return
	}
	s.trace = append(s.trace, fmt.Sprintf("%4d ", s.steps)+fmt.Sprintf(format, args...))
}

func (s *sim) fail(format string, args ...any) {
	if s.failed == "" {
		s.failed = fmt.Sprintf(format, args...)
		s.log("VIOLATION: %s", s.failed)
	}
}

// replay runs seed again, tracing: the same schedule, step for step.
func replay(t testing.TB, seed uint64) *sim {
	s := newSim(t, seed)
	s.tracing = true
	s.failed = s.run()
	return s
}

// newGeneration makes the serving generation's rows, every slot held by
// this worker from checkpoint from.
func (s *sim) newGeneration(from int64) {
	s.slots = make([]*simSlot, s.n)
	for i := range s.slots {
		s.slots[i] = &simSlot{epoch: 1, held: true, checkpoint: from}
	}
	s.maxDelivered[s.gen] = make([]int64, s.n)
	s.checkpoints[s.gen] = make([]int64, s.n)
}

// told is what a pass reads of slot i (the coordinator's resizeOf).
func (s *sim) told(i int) Told {
	sl := s.slots[i]
	switch {
	case !s.resizing:
		return Told{Resize: s.id}
	case s.decided:
		return Told{Resize: s.id, Active: true, Decided: true, Limit: s.cut}
	case sl.proposed:
		return Told{Resize: s.id, Active: true, Proposed: true, Limit: sl.proposal}
	}
	return Told{Resize: s.id, Active: true}
}

// send puts a message under way.
func (s *sim) send(run func(), format string, args ...any) {
	s.inflight = append(s.inflight, simMsg{format, args, run})
}

// pass begins a coordinator pass: it reads the store now; its result
// arrives later.
func (s *sim) pass() {
	if s.passing {
		return
	}
	s.passing = true
	type report struct {
		epoch int64
		told  Told
	}
	gen := s.gen
	reports := map[int]report{}
	for i, sl := range s.slots {
		if sl.held {
			reports[i] = report{sl.epoch, s.told(i)}
		}
	}
	s.log("pass begins: %v", reports) // fmt prints maps sorted
	s.send(func() {
		s.passing = false
		if gen != s.gen {
			return // a pass of a generation since retired: its rows are gone
		}
		owned := map[int]int64{}
		reported := map[int]bool{}
		for i := range s.n {
			r, ok := reports[i]
			if !ok {
				continue
			}
			e, ok := s.drained[i]
			if ok && (e == r.epoch || mutation == mutDrainedBySlot) {
				reported[i] = true
				continue
			}
			owned[i] = r.epoch
		}
		for i := range s.drained {
			if !reported[i] {
				delete(s.drained, i)
			}
		}
		s.owned = owned
		for i := range s.n {
			if r := s.readers[i]; r != nil {
				if e, ok := owned[i]; !ok || e != r.epoch {
					r.dead = true
					delete(s.readers, i)
				}
			}
		}
		for i := range s.n {
			e, ok := owned[i]
			if !ok {
				continue
			}
			r := s.readers[i]
			t := reports[i].told
			if r == nil {
				// Spawned with what this pass read, taken at its start, before
				// it delivers anything (actors: reader.told).
				r = &simReader{slot: i, gen: s.gen, epoch: e, cursor: s.slots[i].checkpoint, delivered: s.slots[i].checkpoint}
				s.readers[i] = r
				s.log("reader %d@%d starts at %d", i, e, r.cursor)
				r.lastTold, r.toldOnce = t, true
				s.tell(r, t)
				continue
			}
			if toldOnce() && r.toldOnce && r.lastTold == t {
				continue // edge-triggered: told once
			}
			r.lastTold, r.toldOnce = t, true
			s.send(func() { s.tell(r, t) }, "tell %d@%d %+v", i, e, t)
		}
	}, "pass result")
}

func (s *sim) tell(r *simReader, t Told) {
	if r.dead {
		return
	}
	if r.part.Phase() == Proposing && mutation == mutAnswerThenOlderTold {
		r.toldDuring = &t
		return
	}
	if mutation == mutSealIgnoredWhileBounded && t.Active && !t.Proposed && !t.Decided && r.part.Phase() != Free {
		return // "it proposes only when !bound.Resizing"
	}
	s.apply(r, r.part.Tell(t, r.cursor))
}

// apply carries out a reader's effects.
func (s *sim) apply(r *simReader, effects []Effect) {
	for _, e := range effects {
		e := e
		s.log("reader %d@%d: %s -> %s", r.slot, r.epoch, e, &r.part)
		switch e.Kind {
		case Propose:
			s.send(func() { s.propose(r, e.Resize, e.Position) }, "propose %d@%d %s", r.slot, r.epoch, e)
		case Drain:
			s.send(func() { s.drain(r, e.Resize, e.Position) }, "drain %d@%d %s", r.slot, r.epoch, e)
		case Done:
			r.dead = true
			s.drained[r.slot] = r.epoch
			delete(s.owned, r.slot)
			delete(s.readers, r.slot)
		}
	}
}

// propose is ProposeCutFor, run by the store now; its answer arrives later.
func (s *sim) propose(r *simReader, resize, cursor int64) {
	if r.gen != s.gen {
		return
	}
	sl := s.slots[r.slot]
	if !sl.held || sl.epoch != r.epoch {
		s.send(func() { r.dead = true }, "proposal fenced out")
		return
	}
	var a Answer
	switch {
	case resize != s.id && mutation != mutAnswerThenOlderTold:
		a = Answer{Resize: resize}
	case !s.resizing:
		a = Answer{Resize: s.id}
	case s.decided:
		a = Answer{Resize: s.id, Active: true, Decided: true, Limit: s.cut}
	default:
		sl.proposal, sl.proposed = max(sl.proposal, cursor, s.head), true
		a = Answer{Resize: s.id, Active: true, Limit: sl.proposal}
		all, c := true, int64(0)
		for _, o := range s.slots {
			all, c = all && o.proposed, max(c, o.proposal)
		}
		if all {
			s.decided, s.cut = true, c
			a = Answer{Resize: s.id, Active: true, Decided: true, Limit: c}
			s.log("store: cut %d decided for resize %d", c, s.id)
		}
	}
	s.log("store: proposal of %d@%d for %d at %d: %+v", r.slot, r.epoch, resize, cursor, a)
	s.send(func() {
		if r.dead {
			return
		}
		if mutation == mutAnswerOverridesToldOnce && r.part.Phase() == Proposing {
			r.part.known = a.knowledge() // whatever is known
			before := r.part.Bound()
			r.part.phase = Free
			s.apply(r, r.part.settle(r.cursor, &before))
			return
		}
		s.apply(r, r.part.Proposal(a, r.cursor))
		if r.toldDuring != nil {
			t := *r.toldDuring
			r.toldDuring = nil
			r.part.known = t.knowledge() // the old reader's setBound(told), whatever its age
			before := r.part.Bound()
			r.part.phase = Free
			s.apply(r, r.part.settle(r.cursor, &before))
		}
	}, "answer %d@%d %+v", r.slot, r.epoch, a)
}

// drain is DrainCutTx, run by the store now.
func (s *sim) drain(r *simReader, resize, cut int64) {
	if r.gen != s.gen {
		return
	}
	sl := s.slots[r.slot]
	switch {
	case !sl.held || sl.epoch != r.epoch:
		s.send(func() { r.dead = true }, "drain fenced out")
		return
	case !s.resizing || !s.decided || s.id != resize || s.cut != cut:
		s.log("store: drain of %d@%d to %d for %d refused", r.slot, r.epoch, cut, resize)
		s.send(func() {
			if !r.dead {
				s.apply(r, r.part.DrainRefused(r.cursor))
			}
		}, "drain refused %d@%d", r.slot, r.epoch)
		return
	case sl.checkpoint > cut:
		s.fail("slot %d: drain to %d with its checkpoint at %d, beyond the cut", r.slot, cut, sl.checkpoint)
		return
	}
	sl.checkpoint, sl.drained, sl.held = cut, true, false
	s.log("store: slot %d drained to %d", r.slot, cut)
	s.send(func() {
		if !r.dead {
			s.apply(r, r.part.DrainDone())
		}
	}, "drained %d@%d", r.slot, r.epoch)
	for _, o := range s.slots {
		if !o.drained {
			return
		}
	}
	// Completed: the next generation serves (here with as many buckets).
	s.log("store: resize %d completed at cut %d", s.id, s.cut)
	s.endAt[s.gen] = s.cut
	for _, r := range s.readers {
		r.dead = true
	}
	s.readers, s.drained, s.owned = map[int]*simReader{}, map[int]int64{}, map[int]int64{}
	s.gen++
	s.resizing, s.decided = false, false
	s.newGeneration(s.cut)
}

func (s *sim) request() {
	if s.resizing {
		return
	}
	s.id++
	s.resizing, s.decided = true, false
	s.log("operator: resize %d requested", s.id)
}

func (s *sim) cancel() {
	if !s.resizing {
		return
	}
	s.resizing, s.decided = false, false
	for _, sl := range s.slots {
		sl.proposal, sl.proposed = 0, false
		if sl.drained {
			sl.drained, sl.held = false, true
			sl.epoch++ // claimed again
		}
	}
	s.log("operator: resize %d cancelled", s.id)
}

// loseLease takes slot i from its holding: the reader stops at once
// (EnsureHeld), and the slot is claimed again at a new epoch.
func (s *sim) loseLease(i int) {
	sl := s.slots[i]
	if !sl.held {
		return
	}
	sl.epoch++
	if r := s.readers[i]; r != nil {
		r.dead = true
	}
	s.log("lease of slot %d lost; claimed again at %d", i, sl.epoch)
}

// readerStep reads, delivers, checkpoints or reports progress.
func (s *sim) readerStep(r *simReader) {
	if r.dead {
		return
	}
	switch s.rng.IntN(4) {
	case 0:
		r.cursor = s.head
	case 1:
		if sl := s.slots[r.slot]; !sl.held || sl.epoch != r.epoch {
			return // EnsureHeld: no delivery on a lease it cannot trust
		}
		next := r.cursor
		if r.part.Beyond(next) {
			next = r.part.Bound().Limit
		}
		if next > r.delivered {
			r.delivered = next
			md := s.maxDelivered[r.gen]
			md[r.slot] = max(md[r.slot], next)
		}
	case 2:
		sl := s.slots[r.slot]
		if sl.held && sl.epoch == r.epoch && r.delivered > sl.checkpoint {
			sl.checkpoint = r.delivered
		}
	case 3:
		s.apply(r, r.part.Progress(r.delivered, true))
	}
}

// check is every invariant, after a step.
func (s *sim) check() {
	for gen, md := range s.maxDelivered {
		end, ended := s.endAt[gen]
		if gen == s.gen && s.resizing && s.decided {
			end, ended = s.cut, true
		}
		for i, d := range md {
			if ended && d > end {
				s.fail("generation %d slot %d delivered through %d, past the cut %d", gen, i, d, end)
			}
		}
	}
	for i, sl := range s.slots {
		if last := s.checkpoints[s.gen][i]; sl.checkpoint < last {
			s.fail("slot %d: checkpoint down from %d to %d", i, last, sl.checkpoint)
		}
		s.checkpoints[s.gen][i] = sl.checkpoint
	}
	for _, r := range s.readers {
		if r.dead || r.gen != s.gen {
			continue
		}
		k := r.part.known
		if r.part.Phase() == Free && k.resize == s.id && s.resizing && k.stage != stageOver && k.stage != 0 {
			s.fail("reader %d@%d knows resize %d in force and is unbounded: %s", r.slot, r.epoch, s.id, &r.part)
		}
		if sl := s.slots[r.slot]; r.delivered < sl.checkpoint && sl.epoch == r.epoch && !sl.drained {
			// a holding never starts below its checkpoint
			s.fail("reader %d@%d delivered %d, below the checkpoint %d", r.slot, r.epoch, r.delivered, sl.checkpoint)
		}
	}
}

// step runs one random action; faults only while faulty.
func (s *sim) step(faulty bool) {
	s.steps++
	x := s.rng.IntN(100)
	switch {
	case x < 10:
		if faulty {
			s.head++ // appends stop with the faults: the readers must catch up
		}
	case x < 20:
		s.pass()
	case x < 55 && len(s.inflight) > 0:
		i := 0
		if faulty {
			i = s.rng.IntN(len(s.inflight)) // late and reordered
		}
		m := s.inflight[i]
		s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
		if s.tracing {
			s.log("runs: %s", fmt.Sprintf(m.format, m.args...))
		}
		m.run()
	case x < 85:
		if r := s.readers[s.rng.IntN(s.n)]; r != nil {
			s.readerStep(r)
		}
	case !faulty:
	case x < 89:
		s.request()
	case x < 92:
		s.cancel()
	case x < 94:
		s.cancel()
		s.request() // a second resize right after a cancel
	case x < 97:
		s.loseLease(s.rng.IntN(s.n))
	}
	s.check()
}

// run is one schedule: faults for a while, then none, until every resize
// ends; it returns the violation, if any.
func (s *sim) run() string {
	for range 300 {
		if s.step(true); s.failed != "" {
			return s.failed
		}
	}
	for range 3000 {
		if s.step(false); s.failed != "" {
			return s.failed
		}
		if !s.resizing && s.quiet() {
			return ""
		}
	}
	return fmt.Sprintf("the resize %d never ended, or not every event was delivered, once the faults stopped "+
		"(state: resizing %v decided %v cut %d head %d; %s)", s.id, s.resizing, s.decided, s.cut, s.head, s.describe())
}

// quiet: every slot of the serving generation has a reader, which has
// delivered every event.
func (s *sim) quiet() bool {
	for i, sl := range s.slots {
		if r := s.readers[i]; sl.held && (r == nil || r.delivered < s.head) {
			return false
		}
	}
	return true
}

func (s *sim) describe() string {
	var b strings.Builder
	for i, sl := range s.slots {
		fmt.Fprintf(&b, "slot %d %+v reader ", i, *sl)
		if r := s.readers[i]; r != nil {
			fmt.Fprintf(&b, "%d@%d %s cursor %d delivered %d; ", r.slot, r.epoch, &r.part, r.cursor, r.delivered)
		} else {
			b.WriteString("none; ")
		}
	}
	return b.String()
}

// theSim is the simulation as internal/simrun runs it.
func theSim(t testing.TB) simrun.Sim {
	var fs []simrun.Fault
	for _, m := range []struct {
		name string
		mut  int
	}{
		{"DrainedBySlot", mutDrainedBySlot},
		{"SealIgnoredWhileBounded", mutSealIgnoredWhileBounded},
		{"AnswerThenOlderTold", mutAnswerThenOlderTold},
		{"AnswerOverridesToldOnce", mutAnswerOverridesToldOnce},
	} {
		fs = append(fs, simrun.Switch(m.name, &mutation, m.mut, mutNone))
	}
	return simrun.Sim{
		Check: func(seed uint64) string { return newSim(t, seed).run() },
		Replay: func(seed uint64) simrun.Run {
			s := replay(t, seed)
			return simrun.Run{Failed: s.failed, Trace: s.trace}
		},
		Faults: fs,
	}
}

// TestSim runs the simulation over many seeds; a failing seed prints its
// trace's tail and replays with -seed.
func TestSim(t *testing.T) { flags.TestSim(t, theSim(t)) }

// TestSimFindsTheFaults re-injects each fault of issue 24 the simulation
// models and requires it found within the seeds TestSim runs: a fault it
// could not find would be a gap in the simulation.
func TestSimFindsTheFaults(t *testing.T) { flags.TestSimFindsTheFaults(t, theSim(t)) }
