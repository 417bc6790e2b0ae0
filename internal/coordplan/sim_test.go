package coordplan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kumi-run/kumi/internal/resizepart"
	"github.com/kumi-run/kumi/internal/simrun"
	"github.com/kumi-run/kumi/leasestore"
)

// The simulation: a pool of one to three workers, each a coordinator
// built from the real plan, sharing a simulated lease table
// (simtable_test.go) — slots with epochs and expiry, claims up to a fair
// share that raise the epoch, two-phase handoffs, a resize's cut that
// readers drain their slots to, and cancels that free the drained slots
// for claims at a new epoch — with simulated readers that drain, find
// their fence lost, stop unsure, and end. A seeded scheduler runs every
// step in any order: pass results late (a pass that read the table before
// a drain, delivered after it), reader reports interleaved with passes, a
// reader's end (a system message) ahead of its last reports, a told state
// missed; workers join late, leave, pause past the TTL, are restarted by
// their supervisor or aborted. Invariants are checked after every step;
// then the faults stop, the pool settles, and what must eventually hold is
// checked.
//
//	go test -run TestSim ./internal/coordplan/ -seed N   # replay one seed, with its trace
//	go test -run TestSim ./internal/coordplan/ -seeds 100000

var flags = simrun.Register(1000)

// shellFault re-injects a fault of the actor around the plan (the sim's
// coord mirrors it), for TestSimFindsTheFaults: 0 is none.
var shellFault int

const (
	// shellPredecessorsPass: a restarted coordinator takes the result of
	// its predecessor's pass (actors: TestARestartedCoordinatorIgnoresItsPredecessorsPass).
	shellPredecessorsPass = iota + 1
)

const (
	simTTL   = 8   // clock ticks a renewal lasts
	simSteps = 400 // scheduler steps with faults, before the pool settles
)

// holding names one holding of a slot.
type holding struct {
	slot  int
	epoch int64
}

// simReader is one reader incarnation.
type simReader struct {
	w, inc   int // its worker, and the coordinator incarnation that spawned it
	slot     int
	id       ID
	epoch    int64
	alive    bool
	stop     bool // asked to stop (ctx.Stop, or its coordinator stops)
	drain    bool // asked to drain
	reported bool // sent its last report (lost fence, cut drained)
	told     resizepart.Told
}

// msg is a message in a coordinator's mailbox.
type msg struct {
	kind  string // pass, lost, cut, gone, handed, tick, left
	inc   int    // pass, gone: the incarnation it is for
	res   leasestore.PassResult
	slot  int
	epoch int64
	id    ID
	ok    bool
}

// work is something run off a coordinator's mailbox (a goroutine).
type work struct {
	kind string // pass, handover, leave
	w    int
	inc  int
	slot int
	ran  bool // pass: it read the table; res is its result
	res  leasestore.PassResult
}

// coord is one worker's coordinator, as the actor runs its plan.
type coord struct {
	w       int
	inc     int
	plan    *State
	readers map[int]*simReader
	passing bool
	again   bool
	mailbox []msg
	system  []*simReader // Terminated of these readers: ahead of the mailbox
	// restarting: halted, a new incarnation starts once its readers all
	// ended (protoactor restarts an actor once its children stopped).
	restarting bool
	// stopping: halted for good (Abort), its readers stop; it ends once
	// it has seen them all gone.
	stopping  bool
	joined    bool // started: a worker may join the pool late
	paused    int  // the coordinator runs nothing before this clock tick (a pause past the TTL)
	departed  bool // left the pool
	leaving   bool
	lostSince map[int]int64 // slot → epoch a lost fence forgot, no pass since
	shown     string        // the last pass result traced
	read      string        // the last pass read traced
}

// choice is one thing the scheduler may run next, with its weight.
type choice struct {
	weight int
	run    func()
}

type sim struct {
	choices   []choice // reused by step
	t         testing.TB
	rng       *rand.Rand
	tracing   bool
	trace     []string
	failed    string
	now       int
	rows      []row
	resize    leasestore.Resize
	workers   []*coord
	readers   []*simReader // the live readers
	work      []*work
	drained   map[holding]bool // every holding drained to a cut
	faults    bool
	unsure    int // budgets
	restarts  int
	stops     int
	pauses    int
	resizes   int
	cancels   bool // the resize in force is to be cancelled
	leaves    int
	quiescing bool
}

func newSim(t testing.TB, seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	s := &sim{t: t, rng: rng, drained: map[holding]bool{}, faults: true,
		unsure: rng.IntN(3), restarts: rng.IntN(3), stops: rng.IntN(2), pauses: rng.IntN(3), resizes: 1 + rng.IntN(3), leaves: rng.IntN(2)}
	s.rows = make([]row, 2+rng.IntN(3))
	for i := range s.rows {
		s.rows[i] = row{owner: -1, claimant: -1}
	}
	s.resize = leasestore.Resize{State: leasestore.ResizeSteady}
	for w := range 1 + rng.IntN(3) {
		c := &coord{w: w, plan: New(), readers: map[int]*simReader{}, lostSince: map[int]int64{}}
		s.workers = append(s.workers, c)
		if w == 0 || rng.IntN(2) == 0 {
			s.join(c)
		}
	}
	return s
}

func (s *sim) logf(format string, args ...any) {
	if s.tracing {
		s.trace = append(s.trace, fmt.Sprintf("%4d t%-3d ", len(s.trace), s.now)+fmt.Sprintf(format, args...))
	}
}

func (s *sim) fail(format string, args ...any) {
	if s.failed == "" {
		s.failed = fmt.Sprintf(format, args...)
		s.logf("VIOLATION: %s", s.failed)
	}
}

// run runs the schedule: steps with faults, then the pool settles. It
// returns the first violation ("" for none).
func (s *sim) run() string {
	for range simSteps {
		if s.failed != "" {
			return s.failed
		}
		s.step()
	}
	s.settle()
	return s.failed
}

// step runs one thing, chosen by the seed among those that can run.
func (s *sim) step() {
	choices, total := s.choices[:0], 0
	add := func(weight int, f func()) {
		choices = append(choices, choice{weight, f})
		total += weight
	}
	for _, c := range s.workers {
		if c.paused > s.now {
			continue
		}
		if len(c.system)+len(c.mailbox) > 0 {
			add(4, func() { s.receive(c) })
		}
		if s.faults && s.pauses > 0 && c.joined && !c.departed {
			add(1, func() { s.pauses--; c.paused = s.now + simTTL + 1; s.logf("w%d: pauses", c.w) })
		}
		if !c.joined {
			add(1, func() { s.join(c) })
			continue
		}
		if !c.departed && s.faults {
			add(2, func() { s.deliver(c, msg{kind: "tick"}) })
		}
		if s.faults && s.restarts > 0 && !c.departed && !c.restarting && !c.leaving && !c.stopping {
			add(1, func() { s.restarts--; s.restart(c) })
		}
		if s.faults && s.stops > 0 && !c.departed && !c.restarting && !c.leaving && !c.stopping && s.live() > 1 {
			add(1, func() { s.stops--; s.stop(c) })
		}
		if s.faults && s.leaves > 0 && !c.departed && !c.leaving && !c.restarting && !c.stopping && s.live() > 1 {
			add(1, func() { s.leaves--; s.beginLeave(c) })
		}
	}
	for _, wk := range s.work {
		if s.workers[wk.w].paused <= s.now {
			add(3, func() { s.runWork(wk) })
		}
	}
	for _, r := range s.readers {
		if r.alive && s.readerCan(r) {
			add(3, func() { s.readerStep(r) })
		}
		if r.alive && s.faults && s.unsure > 0 && !r.reported {
			add(1, func() { s.unsure--; s.report(r, "unsure", msg{kind: "lost", slot: r.slot, epoch: r.epoch}) })
		}
	}
	if s.faults {
		add(1, func() { s.now++ })
		// One resize at a time: leasestore refuses a resize while one
		// runs (ResizeInProgressError), so a cut that stays is the last.
		// One resize at a time: leasestore refuses a resize while one
		// runs (ResizeInProgressError), so a cut that stays is the last.
		switch {
		case s.resize.CutDecided && s.cancels:
			add(1, s.cancel)
		case !s.resize.CutDecided && s.resizes > 0:
			add(1, func() { s.resizes--; s.cut() })
		}
	}
	s.choices = choices
	if total == 0 {
		return
	}
	n := s.rng.IntN(total)
	for _, c := range choices {
		if n -= c.weight; n < 0 {
			c.run()
			break
		}
	}
	s.check()
}

// settle stops the faults and lets the pool settle: every worker passes,
// round after round, everything delivered, the clock a tick further each
// round (an aborted worker's leases expire) until the table stays the
// same; then it checks what must eventually hold.
func (s *sim) settle() {
	s.faults, s.quiescing = false, true
	for _, c := range s.workers {
		c.paused = 0
	}
	s.logf("-- faults stop; the pool settles")
	for round, same := 0, 0; round < 40 && (same < 3 || round <= simTTL); round++ {
		before := s.layout()
		for n := 0; s.failed == "" && n < 10000; n++ {
			if !s.busy() {
				break
			}
			s.step()
		}
		for _, c := range s.workers {
			if !c.joined {
				s.join(c)
			}
			if !c.departed {
				s.deliver(c, msg{kind: "tick"})
			}
		}
		if same++; !slices.Equal(before, s.layout()) {
			same = 0
		}
		s.now++ // a worker that stopped for good loses its leases
	}
	for n := 0; s.failed == "" && n < 10000 && s.busy(); n++ {
		s.step()
	}
	if s.failed != "" {
		return
	}
	for slot, r := range s.rows {
		for _, c := range s.workers {
			live := c.liveReader(slot)
			switch {
			case r.owner == c.w && r.claimant < 0 && !r.drained && !c.leaving && !c.departed && !s.expired(r):
				if live == nil || live.epoch != r.epoch || live.stop || live.drain {
					s.fail("w%d holds slot %d at %d, ready, not handed off, with no reader (%v)", c.w, slot, r.epoch, live)
				}
			case r.owner == c.w && r.claimant >= 0 && live != nil:
				s.fail("slot %d's handoff from w%d to w%d never ends: its reader runs", slot, c.w, r.claimant)
			}
		}
	}
	for slot, r := range s.rows {
		if s.resize.CutDecided && !r.drained {
			s.fail("the cut is decided, and slot %d never drains to it", slot)
		}
	}
	for _, c := range s.workers {
		if c.leaving && (!c.departed || len(c.readers) > 0) {
			s.fail("w%d began to leave and never left (readers %d)", c.w, len(c.readers))
		}
	}
}

// busy reports whether anything is left to run.
func (s *sim) busy() bool {
	for _, c := range s.workers {
		if len(c.system)+len(c.mailbox) > 0 {
			return true
		}
	}
	for _, r := range s.readers {
		if r.alive && s.readerCan(r) {
			return true
		}
	}
	return len(s.work) > 0
}

func (s *sim) live() int {
	n := 0
	for _, c := range s.workers {
		if c.joined && !c.departed && !c.leaving && !c.stopping {
			n++
		}
	}
	return n
}

func (c *coord) liveReader(slot int) *simReader {
	if r := c.readers[slot]; r != nil && r.alive {
		return r
	}
	return nil
}

// deliver puts m in c's mailbox (a departed coordinator gets nothing).
func (s *sim) deliver(c *coord, m msg) {
	if !c.departed {
		c.mailbox = append(c.mailbox, m)
	}
}

// receive runs c's next message: a system message first.
func (s *sim) receive(c *coord) {
	if len(c.system) > 0 {
		r := c.system[0]
		c.system = c.system[1:]
		s.logf("w%d: terminated r%d.%d slot %d@%d", c.w, r.inc, r.id, r.slot, r.epoch)
		gone := msg{kind: "gone", inc: c.inc}
		if c.readers[r.slot] == r {
			gone.slot, gone.id = r.slot, r.id
			s.do(c, c.plan.Terminated(r.slot, r.id))
		}
		c.mailbox = append(c.mailbox, gone)
		s.childrenGone(c)
		return
	}
	m := c.mailbox[0]
	c.mailbox = c.mailbox[1:]
	switch m.kind {
	case "tick":
		s.do(c, []Action{{Kind: Pass}})
	case "pass":
		if m.inc != c.inc && shellFault != shellPredecessorsPass {
			s.logf("w%d: a pass of incarnation %d, ignored", c.w, m.inc)
			return
		}
		c.passing = false
		if shown := show(m.res); shown != c.shown {
			c.shown = shown // (a pass like the one before is not traced)
			s.logf("w%d: pass result %s", c.w, shown)
		}
		if !c.plan.Leaving {
			c.lostSince = map[int]int64{}
		}
		s.do(c, c.plan.Pass(m.res))
		if c.again {
			c.again = false
			s.do(c, []Action{{Kind: Pass}})
		}
	case "lost":
		s.logf("w%d: lost fence slot %d@%d", c.w, m.slot, m.epoch)
		before, had := c.plan.Owned[m.slot]
		acts := c.plan.LostFence(m.slot, m.epoch)
		s.sameOtherHolding(c, m, before, had)
		if had && before.Epoch == m.epoch {
			c.lostSince[m.slot] = m.epoch
		}
		s.do(c, acts)
	case "cut":
		s.logf("w%d: cut drained slot %d@%d", c.w, m.slot, m.epoch)
		before, had := c.plan.Owned[m.slot]
		acts := c.plan.CutDrained(m.slot, m.epoch)
		s.sameOtherHolding(c, m, before, had)
		s.do(c, acts)
	case "gone":
		id := m.id
		if m.inc != c.inc {
			id = 0 // a reader of the incarnation before: its ids start over
		}
		s.logf("w%d: gone slot %d r%d", c.w, m.slot, id)
		s.do(c, c.plan.Gone(m.slot, id))
		if c.stopping && len(c.plan.Readers) == 0 {
			s.logf("w%d: stopped, its leases left to expire", c.w)
			c.departed, c.mailbox = true, nil
		}
	case "handed":
		s.logf("w%d: handed over slot %d: %v", c.w, m.slot, m.ok)
		s.do(c, c.plan.HandedOver(m.slot, m.ok))
	case "left":
		s.logf("w%d: left", c.w)
		c.departed = true
		c.plan.Halt()
		c.mailbox = nil
	}
}

// sameOtherHolding checks that a report about the holding of m.slot at
// m.epoch changed nothing of a holding at another epoch.
func (s *sim) sameOtherHolding(c *coord, m msg, before leasestore.Lease, had bool) {
	if had && before.Epoch != m.epoch {
		if now, ok := c.plan.Owned[m.slot]; !ok || now.Epoch != before.Epoch {
			s.fail("w%d: a report of slot %d at epoch %d forgot its holding at %d", c.w, m.slot, m.epoch, before.Epoch)
		}
	}
}

// do carries out the plan's actions, as the actor does.
func (s *sim) do(c *coord, acts []Action) {
	for _, a := range acts {
		r := c.readers[a.Slot]
		if r != nil && r.id != a.Reader {
			r = nil
		}
		if a.Kind != ForgetMarks && a.Kind != Pass && (a.Kind != Tell || r != nil && r.told != a.Told) {
			s.logf("w%d:   %s", c.w, a) // (telling a reader what it was told is not traced)
		}
		switch a.Kind {
		case Stop:
			if r != nil {
				r.stop = true
			}
		case Drain:
			if r != nil {
				r.drain = true
			}
		case Tell:
			switch {
			case r == nil:
			case s.faults && r.told != a.Told && s.rng.IntN(4) == 0:
				s.logf("r%d.%d misses it", r.inc, r.id) // (busy elsewhere: it converges at the next)
			default:
				r.told = a.Told
			}
		case HandOver:
			s.work = append(s.work, &work{kind: "handover", w: c.w, slot: a.Slot})
		case Spawn:
			s.spawn(c, a)
		case Pass:
			if c.plan.Leaving || c.plan.Halted {
				break
			}
			if c.passing {
				c.again = true
				break
			}
			c.passing = true
			s.work = append(s.work, &work{kind: "pass", w: c.w, inc: c.inc})
		case Leave:
			s.work = append(s.work, &work{kind: "leave", w: c.w})
		}
	}
	for slot, r := range c.readers {
		if p := c.plan.Readers[slot]; p == nil || p.ID != r.id {
			delete(c.readers, slot)
		}
	}
}

// spawn checks that the reader may start, and starts it.
func (s *sim) spawn(c *coord, a Action) {
	switch h := (holding{a.Slot, a.Epoch}); {
	case c.restarting || c.stopping || c.plan.Halted:
		s.fail("w%d spawns a reader for slot %d while it stops", c.w, a.Slot)
	case c.leaving:
		s.fail("w%d spawns a reader for slot %d while it leaves", c.w, a.Slot)
	case s.drained[h]:
		s.fail("w%d spawns a reader for slot %d at epoch %d, drained to the cut at that epoch", c.w, a.Slot, a.Epoch)
	case c.lostSince[a.Slot] == a.Epoch && a.Epoch != 0:
		s.fail("w%d spawns a reader for slot %d at epoch %d, whose reader stopped on a lost fence with no pass since", c.w, a.Slot, a.Epoch)
	}
	for _, r := range s.readers {
		if r.alive && r.w == c.w && r.slot == a.Slot {
			s.fail("w%d spawns a second reader for slot %d (r%d.%d still runs)", c.w, a.Slot, r.inc, r.id)
		}
	}
	r := &simReader{w: c.w, inc: c.inc, slot: a.Slot, id: a.Reader, epoch: a.Epoch, alive: true, told: a.Told}
	s.readers = append(s.readers, r)
	c.readers[a.Slot] = r
}

// readerCan reports whether r has something to do: stop, drain, find its
// fence lost, or drain to the cut.
func (s *sim) readerCan(r *simReader) bool {
	return r.stop || r.drain || s.fenceLost(r) || s.mayDrainToCut(r)
}

func (s *sim) fenceLost(r *simReader) bool {
	row := s.rows[r.slot]
	return row.owner != r.w || row.epoch != r.epoch || s.expired(row)
}

func (s *sim) mayDrainToCut(r *simReader) bool {
	return r.told.Decided && s.resize.CutDecided && r.told.Resize == s.resize.ID && !s.fenceLost(r)
}

// readerStep runs what r does next. A reader asked to stop may still send
// one last report it was about to send.
func (s *sim) readerStep(r *simReader) {
	switch {
	case s.fenceLost(r) && !r.reported && (!r.stop || s.rng.IntN(2) == 0):
		s.report(r, "fence lost", msg{kind: "lost", slot: r.slot, epoch: r.epoch})
	case s.mayDrainToCut(r) && !r.reported && (!r.stop || s.rng.IntN(2) == 0):
		s.drainRow(r.slot)
		s.drained[holding{r.slot, r.epoch}] = true
		s.report(r, "drained to the cut", msg{kind: "cut", slot: r.slot, epoch: r.epoch})
	default:
		s.end(r, "stops")
	}
}

// report sends r's last report to its coordinator, and ends r.
func (s *sim) report(r *simReader, why string, m msg) {
	r.reported = true
	s.deliver(s.workers[r.w], m)
	s.end(r, why)
}

// end ends r: its Terminated goes to its coordinator's system messages.
func (s *sim) end(r *simReader, why string) {
	s.logf("r%d.%d (w%d slot %d@%d) %s", r.inc, r.id, r.w, r.slot, r.epoch, why)
	r.alive = false
	for i, x := range s.readers {
		if x == r {
			s.readers = append(s.readers[:i], s.readers[i+1:]...)
			break
		}
	}
	if c := s.workers[r.w]; !c.departed {
		c.system = append(c.system, r)
	}
}

// restart halts c as its supervisor's restart does: its readers stop
// with it, and a new incarnation starts once they have all ended.
func (s *sim) restart(c *coord) {
	s.logf("w%d: restarts", c.w)
	c.plan.Halt()
	c.restarting = true
	for _, r := range c.readers {
		r.stop = true
	}
	s.childrenGone(c)
}

// childrenGone starts c's next incarnation once, restarting, it has
// received the end of every reader it spawned.
func (s *sim) childrenGone(c *coord) {
	if !c.restarting || len(c.system) > 0 {
		return
	}
	for _, r := range s.readers {
		if r.alive && r.w == c.w {
			return
		}
	}
	s.reincarnate(c)
}

// stop halts c for good (Abort): its readers stop, and it goes on
// receiving until it has seen them gone.
func (s *sim) stop(c *coord) {
	s.logf("w%d: stops", c.w)
	c.plan.Halt()
	c.stopping = true
	for _, r := range c.readers {
		r.stop = true
	}
	if len(c.plan.Readers) == 0 {
		c.departed, c.mailbox = true, nil
	}
}

func (s *sim) reincarnate(c *coord) {
	c.inc++
	c.plan, c.readers, c.passing, c.again, c.restarting = New(), map[int]*simReader{}, false, false, false
	c.lostSince = map[int]int64{}
	s.logf("w%d: incarnation %d starts", c.w, c.inc)
	s.do(c, []Action{{Kind: Pass}})
}

// join starts c's coordinator: its first pass.
func (s *sim) join(c *coord) {
	s.logf("w%d: joins", c.w)
	c.joined = true
	s.do(c, []Action{{Kind: Pass}})
}

func (s *sim) beginLeave(c *coord) {
	s.logf("w%d: begins to leave", c.w)
	c.leaving = true
	s.do(c, c.plan.BeginLeave())
}

// runWork runs wk: a pass reads the table (its result delivered at a later
// step), a handover or a leave writes it and answers.
func (s *sim) runWork(wk *work) {
	c := s.workers[wk.w]
	switch {
	case wk.kind == "pass" && !wk.ran:
		wk.ran = true
		if !c.departed {
			wk.res = s.pass(wk.w)
			if read := show(wk.res); read != c.read {
				c.read = read // (a pass that reads what the one before read is not traced)
				s.logf("w%d: pass reads the table: %s", wk.w, read)
			}
		}
		return
	case wk.kind == "pass":
		s.deliver(c, msg{kind: "pass", inc: wk.inc, res: wk.res})
	case wk.kind == "handover":
		r := &s.rows[wk.slot]
		ok := r.owner == wk.w && r.claimant >= 0 && !s.expired(*r)
		if ok {
			r.owner, r.given = -1, true
		}
		s.deliver(c, msg{kind: "handed", slot: wk.slot, ok: ok})
	case wk.kind == "leave":
		for i := range s.rows {
			if r := &s.rows[i]; r.owner == wk.w {
				r.owner, r.claimant, r.given = -1, -1, false
			}
		}
		s.deliver(c, msg{kind: "left"})
	}
	for i, x := range s.work {
		if x == wk {
			s.work = append(s.work[:i], s.work[i+1:]...)
			break
		}
	}
}

// check checks what holds after every step: every reader the plan counts
// as running serves a slot it owns at its epoch, or has already ended or
// reported; one reader at most per slot and worker (see spawn).
func (s *sim) check() {
	for _, c := range s.workers {
		if c.plan.Halted || c.departed {
			continue
		}
		for slot, p := range c.plan.Readers {
			r := c.readers[slot]
			if p.Stopping || p.Draining || r == nil || !r.alive || r.reported {
				continue
			}
			if l, ok := c.plan.Owned[slot]; !ok || l.Epoch != p.Epoch {
				s.fail("w%d: reader r%d of slot %d@%d runs, the slot not owned at its epoch (owned: %v at %d)", c.w, p.ID, slot, p.Epoch, ok, l.Epoch)
			}
		}
	}
}

// replay runs seed again, tracing: the same schedule, step for step.
func replay(t testing.TB, seed uint64) *sim {
	s := newSim(t, seed)
	s.tracing = true
	s.run()
	return s
}

// TestSim runs the simulation over many seeds; a failing seed prints its
// trace's tail and replays with -seed.
func TestSim(t *testing.T) { flags.TestSim(t, theSim(t)) }

// theSim is the simulation as internal/simrun runs it.
func theSim(t testing.TB) simrun.Sim {
	var fs []simrun.Fault
	for _, f := range []struct {
		name  string
		fault Fault
		shell int
	}{
		{"HaltIgnored", FaultHaltIgnored, 0},
		{"GoneAtTerminated", FaultGoneAtTerminated, 0},
		{"LostKept", FaultLostKept, 0},
		{"LostBySlot", FaultLostBySlot, 0},
		{"DrainedBySlot", FaultDrainedBySlot, 0},
		{"DrainedForgotten", FaultDrainedForgotten, 0},
		{"ToldOnce", FaultToldOnce, 0},
		{"PredecessorsPass", FaultNone, shellPredecessorsPass},
	} {
		fs = append(fs, simrun.Fault{Name: f.name, Set: func() func() {
			fault, shellFault = f.fault, f.shell
			return func() { fault, shellFault = FaultNone, 0 }
		}})
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

// TestSimFindsTheFaults re-injects each of the coordinator's past bugs
// (see Fault), one at a time, and requires the simulation to find it
// within the seeds TestSim runs; -finds counts the seeds that find each.
func TestSimFindsTheFaults(t *testing.T) { flags.TestSimFindsTheFaults(t, theSim(t)) }
