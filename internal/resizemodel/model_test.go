// Package resizemodel checks the resize protocol of docs/design/resize.md on a
// tiny model by exploring every interleaving of its steps: appends (in a
// fixed order of streams, at any moment), the request, claims of old and
// new slots, deliveries, checkpoint flushes, proposals (the transaction,
// and separately the reader receiving its answer), the pass telling a
// reader of the sealing, the cut or a cancel, drains, new readers starting
// once ready, graceful releases (handoffs), crashes and a cancel. It holds
// no kumi code: it is the design's proof sketch made executable, and each
// of the design's safeguards, removed in turn (a mutant), must make it
// fail.
//
// What the model abstracts: a database transaction is one atomic step; a
// delivery is handed over and acknowledged in one step (MaxInFlight 1); a
// worker delivers only while the slot's row names it at its epoch, which
// is what EnsureHeld's margin makes true of the real thing (lemma L1 of
// docs/design/resize.md) — so a zombie's one stale action is not modelled; a
// crash frees the dead worker's slots at once (the TTL, or the evidence,
// compressed to a step) and loses what it had not checkpointed. Fair
// shares, passes and notifications are not modelled: any worker may claim
// any free slot at any moment, which covers every assignment they could
// produce.
package resizemodel

import (
	"fmt"
	"testing"

	"github.com/kumi-run/kumi/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

const (
	maxSlots   = 4
	maxWorkers = 2
	maxStreams = 2
	maxEvents  = 4
	none       = -1
)

type phase int8

const (
	steady   phase = iota // generation 0 serves (also after a cancel)
	sealing               // old holders propose bounds
	cut                   // C decided, old slots drain to it
	switched              // some new slot is ready
	done                  // generation 1 serves
)

// mutant removes one safeguard of the design.
type mutant int

const (
	correct       mutant = iota
	noHead               // a proposal omits the head read after the fence
	noRowBound           // a holding granted after a proposal (or the cut) starts unbounded
	noFreeze             // a sealing reader delivers on while its proposal is in flight
	ownBucketOnly        // new bucket j waits for old bucket j mod N only, not for F(j)
	drainEarly           // an old slot drains before reading through the cut
)

func (m mutant) String() string {
	return [...]string{"correct", "noHead", "noRowBound", "noFreeze", "ownBucketOnly", "drainEarly"}[m]
}

// reader is a worker's reader of one slot (its belief, and its position).
type reader struct {
	active  bool
	epoch   int8
	standby bool // a new slot held before it is ready
	cursor  int8 // every event of the bucket up to here is delivered
	knows   bool // knows of the resize: delivers at most up to bound
	bound   int8
	frozen  bool // sealing: delivers nothing beyond sent until its answer comes
	sent    int8 // the cursor it proposed with
	replied bool // its proposal committed; the answer is on its way
	reply   int8 // the answer: its bound, or none for "cancelled"
}

// slot is a lease row with its checkpoint.
type slot struct {
	owner    int8 // 0: free, else worker+1
	epoch    int8
	ckpt     int8
	proposal int8
	drained  bool
}

// state is the whole model: the database and every worker's readers.
type state struct {
	phase     phase
	requested bool
	cancelled bool
	decided   bool
	cut       int8
	head      int8
	ev        [maxEvents + 1]int8 // the stream of each position (1-based)
	old, new  [maxSlots]slot
	rOld      [maxWorkers][maxSlots]reader
	rNew      [maxWorkers][maxSlots]reader
	delivered [maxEvents + 1]int8 // deliveries per position, capped at 2
	maxOld    int8                // the highest position the old generation delivered
	crashes   int8
	releases  int8
}

type config struct {
	workers  int  // up to maxWorkers
	flush    bool // checkpoint flushes between deliveries (else only at releases and drains)
	n, m     int
	hashes   []int // one per stream: the consumer-group hash
	script   []int // the stream of each append, in order (appends interleave with everything else)
	limit    int   // explore at most this many states (0: no limit)
	crashes  int
	releases int
	cancel   bool
	mut      mutant
}

func (c config) String() string {
	return fmt.Sprintf("%d->%d/hashes=%v/script=%v/workers=%d/flush=%v/crashes=%d/releases=%d/cancel=%v/%s",
		c.n, c.m, c.hashes, c.script, c.workers, c.flush, c.crashes, c.releases, c.cancel, c.mut)
}

func (c *config) oldBucket(s *state, p int8) int { return c.hashes[s.ev[p]] % c.n }
func (c *config) newBucket(s *state, p int8) int { return c.hashes[s.ev[p]] % c.m }

// The names of the actors, made once: formatting them for every step
// would cost more than the search.
var whoNames, oldNames, newNames = func() (w []string, o, n [maxWorkers][maxSlots]string) {
	for i := 0; i < maxWorkers; i++ {
		w = append(w, fmt.Sprintf("w%d", i))
		for j := 0; j < maxSlots; j++ {
			o[i][j], n[i][j] = fmt.Sprintf("w%d old %d", i, j), fmt.Sprintf("w%d new %d", i, j)
		}
	}
	return w, o, n
}()

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// feeds reports whether old bucket i can hold a stream of new bucket j.
func (c *config) feeds(i, j int) bool {
	if c.mut == ownBucketOnly {
		return i == j%c.n
	}
	return i%gcd(c.n, c.m) == j%gcd(c.n, c.m)
}

func (c *config) feedersDrained(s *state, j int) bool {
	for i := 0; i < c.n; i++ {
		if c.feeds(i, j) && !s.old[i].drained {
			return false
		}
	}
	return true
}

func (c *config) ready(s *state, j int) bool {
	return (s.phase == switched || s.phase == done) && c.feedersDrained(s, j)
}

// next is the first position in (after, limit] of a bucket, or none.
func next(s *state, bucket func(*state, int8) int, b int, after, limit int8) int8 {
	for p := after + 1; p <= limit && p <= s.head; p++ {
		if bucket(s, p) == b {
			return p
		}
	}
	return none
}

// label names a step; it is formatted only for a trace.
type label struct {
	what string
	who  string // "", "w0 old 1", …
	p    int8   // a position, when the step has one
}

func (l label) String() string {
	out := l.what
	if l.who != "" {
		out = l.who + ": " + out
	}
	if l.p > 0 {
		out += fmt.Sprintf(" %d", l.p)
	}
	return out
}

// edge is one step: the state after it, its name, and the invariant it
// broke ("" when none).
type edge struct {
	to        state
	step      label
	violation string
}

// deliver records a delivery and checks the invariants it could break.
func (c *config) deliver(s *state, p int8, oldGen bool) string {
	v := ""
	if oldGen {
		if s.decided && p > s.cut {
			v = fmt.Sprintf("L2: the old generation delivered position %d above the cut %d", p, s.cut)
		}
		s.maxOld = max(s.maxOld, p)
	} else if !s.decided || p <= s.cut {
		v = fmt.Sprintf("L4: the new generation delivered position %d, not above the cut %d", p, s.cut)
	}
	if s.delivered[p] == 0 {
		for q := p - 1; q >= 1; q-- { // the stream's previous event
			if s.ev[q] == s.ev[p] {
				if s.delivered[q] == 0 && v == "" {
					v = fmt.Sprintf("order: position %d delivered before position %d of its stream", p, q)
				}
				break
			}
		}
	} else if s.crashes == 0 && v == "" {
		v = fmt.Sprintf("duplicate: position %d delivered again without a crash", p)
	}
	s.delivered[p] = min(s.delivered[p]+1, 2)
	return v
}

// advance makes the switch and the completion, as DrainTx does.
func (c *config) advance(s *state) {
	if s.phase == cut {
		for j := 0; j < c.m; j++ {
			if c.feedersDrained(s, j) {
				s.phase = switched
				break
			}
		}
	}
	for i := 0; i < c.n; i++ {
		if !s.old[i].drained {
			return
		}
	}
	s.phase = done
}

// startOld is a reader of old slot i starting on a grant: the bound comes
// from the row it was granted on (the bound rule).
func (c *config) startOld(s *state, w, i int) {
	r := reader{active: true, epoch: s.old[i].epoch, cursor: s.old[i].ckpt}
	switch {
	case c.mut == noRowBound || s.phase == steady || s.phase == done:
	case s.decided:
		r.knows, r.bound = true, s.cut
	case s.old[i].proposal != none:
		r.knows, r.bound = true, s.old[i].proposal
	default: // sealing and no proposal yet: propose before delivering
		r.knows, r.frozen, r.sent = true, true, r.cursor
	}
	s.rOld[w][i] = r
}

func (c *config) succ(s state) []edge {
	var out []edge
	add := func(t state, step label, v string) { out = append(out, edge{t, step, v}) }
	if int(s.head) < len(c.script) {
		t := s
		t.head++
		t.ev[t.head] = int8(c.script[s.head])
		add(t, label{what: "append at", p: t.head}, "")
	}
	if s.phase == steady && !s.requested {
		t := s
		t.phase, t.requested = sealing, true
		add(t, label{what: "request"}, "")
	}
	if c.cancel && !s.cancelled && (s.phase == sealing || s.phase == cut) {
		t := s
		t.phase, t.cancelled, t.decided, t.cut = steady, true, false, 0
		for i := 0; i < c.n; i++ {
			t.old[i].proposal, t.old[i].drained = none, false
		}
		t.new = [maxSlots]slot{}
		t.rNew = [maxWorkers][maxSlots]reader{}
		add(t, label{what: "cancel"}, "")
	}
	if c.crashes > int(s.crashes) {
		for w := 0; w < c.workers; w++ {
			t := s
			t.crashes++
			for i := range t.old {
				if t.old[i].owner == int8(w+1) {
					t.old[i].owner = 0
				}
				if t.new[i].owner == int8(w+1) {
					t.new[i].owner = 0
				}
			}
			t.rOld[w], t.rNew[w] = [maxSlots]reader{}, [maxSlots]reader{}
			add(t, label{what: "crash", who: whoNames[w]}, "")
		}
	}
	for w := 0; w < c.workers; w++ {
		me := int8(w + 1)
		for i := 0; i < c.n; i++ {
			out = c.oldSteps(s, out, w, me, i)
		}
		for j := 0; j < c.m; j++ {
			out = c.newSteps(s, out, w, me, j)
		}
	}
	return out
}

func (c *config) oldSteps(s state, out []edge, w int, me int8, i int) []edge {
	add := func(t state, step string, v string) {
		out = append(out, edge{t, label{what: step, who: oldNames[w][i]}, v})
	}
	sl, r := s.old[i], s.rOld[w][i]
	if sl.owner == 0 && !sl.drained && s.phase != done {
		t := s
		t.old[i].owner, t.old[i].epoch = me, sl.epoch+1
		c.startOld(&t, w, i)
		add(t, "claim", "")
	}
	if !r.active || sl.owner != me || sl.epoch != r.epoch {
		return out
	}
	// Deliver the next event of the bucket within the reader's bound.
	limit := s.head
	if r.knows {
		limit = r.bound
	}
	if r.frozen {
		limit = r.sent
		if c.mut == noFreeze {
			limit = s.head
		}
	}
	if p := next(&s, c.oldBucket, i, r.cursor, limit); p != none {
		t := s
		t.rOld[w][i].cursor = p
		out = append(out, edge{t, label{what: "deliver", who: oldNames[w][i], p: p}, c.deliver(&t, p, true)})
	}
	if c.flush && r.cursor > sl.ckpt {
		t := s
		t.old[i].ckpt = r.cursor
		add(t, "flush", "")
	}
	if c.releases > int(s.releases) {
		t := s
		t.releases++
		t.old[i].ckpt, t.old[i].owner = max(sl.ckpt, r.cursor), 0
		t.rOld[w][i] = reader{}
		add(t, "release", "")
	}
	// The pass tells the reader what it learned.
	switch {
	case s.phase == sealing && !r.knows:
		t := s
		t.rOld[w][i].knows, t.rOld[w][i].frozen, t.rOld[w][i].sent = true, true, r.cursor
		add(t, "learn sealing", "")
	case (s.phase == cut || s.phase == switched) && !r.replied && (!r.knows || r.frozen || r.bound != s.cut):
		t := s
		t.rOld[w][i].knows, t.rOld[w][i].frozen, t.rOld[w][i].bound = true, false, s.cut
		add(t, "learn the cut", "")
	case s.phase == steady && r.knows && !r.replied:
		t := s
		t.rOld[w][i] = reader{active: true, epoch: r.epoch, cursor: r.cursor}
		add(t, "learn the cancel", "")
	}
	// ProposeCut: the transaction, then the answer.
	if r.frozen && !r.replied {
		t := s
		t.rOld[w][i].replied = true
		v := ""
		switch s.phase {
		case sealing:
			p := max(sl.proposal, r.sent)
			if c.mut != noHead {
				p = max(p, s.head)
			}
			t.old[i].proposal = p
			t.rOld[w][i].reply = p
			all := true
			for k := 0; k < c.n; k++ {
				all = all && t.old[k].proposal != none
			}
			if all {
				t.phase, t.decided = cut, true
				for k := 0; k < c.n; k++ {
					t.cut = max(t.cut, t.old[k].proposal)
				}
				for k := 0; k < c.m; k++ {
					t.new[k].ckpt = t.cut
				}
				t.rOld[w][i].reply = t.cut
				if t.maxOld > t.cut {
					v = fmt.Sprintf("L2: the cut %d is below position %d, which the old generation delivered", t.cut, t.maxOld)
				}
			}
		case cut, switched:
			t.rOld[w][i].reply = s.cut
		default:
			t.rOld[w][i].reply = none
		}
		add(t, "propose", v)
	}
	if r.replied {
		t := s
		tr := &t.rOld[w][i]
		tr.replied, tr.frozen = false, false
		if r.reply == none {
			tr.knows = false
		} else {
			tr.bound = r.reply
		}
		add(t, "answer", "")
	}
	// DrainTx.
	if (s.phase == cut || s.phase == switched) && r.knows && !r.frozen && r.bound == s.cut &&
		(c.mut == drainEarly || next(&s, c.oldBucket, i, r.cursor, s.cut) == none) {
		t := s
		v := ""
		if sl.ckpt > s.cut {
			v = fmt.Sprintf("a drained checkpoint %d above the cut %d", sl.ckpt, s.cut)
		}
		t.old[i].ckpt, t.old[i].drained, t.old[i].owner = s.cut, true, 0
		t.rOld[w][i] = reader{}
		c.advance(&t)
		add(t, "drain", v)
	}
	return out
}

func (c *config) newSteps(s state, out []edge, w int, me int8, j int) []edge {
	add := func(t state, step string, v string) {
		out = append(out, edge{t, label{what: step, who: newNames[w][j]}, v})
	}
	sl, r := s.new[j], s.rNew[w][j]
	if sl.owner == 0 && s.phase != steady {
		t := s
		t.new[j].owner, t.new[j].epoch = me, sl.epoch+1
		t.rNew[w][j] = reader{active: true, epoch: sl.epoch + 1, standby: true}
		add(t, "claim", "")
	}
	if !r.active || sl.owner != me || sl.epoch != r.epoch {
		return out
	}
	if r.standby {
		if c.ready(&s, j) {
			t := s
			t.rNew[w][j].standby, t.rNew[w][j].cursor = false, sl.ckpt
			add(t, "start", "")
		}
	} else {
		if p := next(&s, c.newBucket, j, r.cursor, s.head); p != none {
			t := s
			t.rNew[w][j].cursor = p
			out = append(out, edge{t, label{what: "deliver", who: newNames[w][j], p: p}, c.deliver(&t, p, false)})
		}
		if c.flush && r.cursor > sl.ckpt {
			t := s
			t.new[j].ckpt = r.cursor
			add(t, "flush", "")
		}
	}
	if c.releases > int(s.releases) {
		t := s
		t.releases++
		if !r.standby {
			t.new[j].ckpt = max(sl.ckpt, r.cursor)
		}
		t.new[j].owner = 0
		t.rNew[w][j] = reader{}
		add(t, "release", "")
	}
	return out
}

// terminal checks a state with no step left: everything appended was
// delivered, and the resize ended (completed, or cancelled).
func (c *config) terminal(s *state) string {
	for p := int8(1); p <= s.head; p++ {
		if s.delivered[p] == 0 {
			return fmt.Sprintf("lost: position %d never delivered", p)
		}
	}
	if s.phase != done && !(s.phase == steady && s.cancelled) {
		return fmt.Sprintf("stuck in phase %d", s.phase)
	}
	return ""
}

type result struct {
	states, terminals int
	truncated         bool
	violation         string
	trace             []string
}

// explore visits every reachable state depth first and stops at the first
// violation, with the steps that led to it.
func explore(c config) result {
	start := state{}
	for i := range start.old {
		start.old[i].proposal, start.new[i].proposal = none, none
	}
	type frame struct {
		s     state
		edges []edge
		step  label
	}
	seen := map[state]bool{start: true}
	stack := []frame{{s: start, edges: c.succ(start)}}
	res := result{states: 1}
	trace := func(last label) []string {
		var tr []string
		for _, f := range stack[1:] {
			tr = append(tr, f.step.String())
		}
		return append(tr, last.String())
	}
	if len(stack[0].edges) == 0 {
		res.terminals++
	}
	for len(stack) > 0 {
		top := &stack[len(stack)-1]
		if len(top.edges) == 0 {
			stack = stack[:len(stack)-1]
			continue
		}
		e := top.edges[0]
		top.edges = top.edges[1:]
		if e.violation != "" {
			res.violation, res.trace = e.violation, trace(e.step)
			return res
		}
		if seen[e.to] {
			continue
		}
		seen[e.to] = true
		res.states++
		edges := c.succ(e.to)
		if len(edges) == 0 {
			res.terminals++
			if v := c.terminal(&e.to); v != "" {
				res.violation, res.trace = v, trace(e.step)
				return res
			}
		}
		if c.limit > 0 && res.states >= c.limit {
			res.truncated = true
			return res
		}
		stack = append(stack, frame{s: e.to, edges: edges, step: e.step})
	}
	return res
}

// The protocol as designed: no interleaving of the model's steps loses an
// event, delivers one twice without a crash, delivers a stream out of
// order, lets the old generation deliver above the cut or the new one at
// or below it, or leaves the resize unfinished — up and down, with a
// common divisor and without, with crashes, releases (handoffs), both in
// one run, and a cancel.
func TestTheProtocolKeepsItsInvariants(t *testing.T) {
	t.Parallel()
	for _, c := range []config{
		{workers: 1, n: 1, m: 2, hashes: []int{0, 1}, script: []int{0, 1, 0}, crashes: 1, releases: 1, flush: true},
		// A kill and a graceful leave in the same run, by two workers
		// (the fault suite's resizes: one worker killed, another leaving).
		{workers: 2, n: 1, m: 2, hashes: []int{0, 1}, script: []int{0, 1, 0}, crashes: 1, releases: 1},
		{workers: 1, n: 2, m: 1, hashes: []int{0, 1}, script: []int{0, 1, 0}, crashes: 1},
		{workers: 1, n: 2, m: 1, hashes: []int{0, 1}, script: []int{0, 1, 0}, releases: 1},
		{workers: 2, n: 2, m: 3, hashes: []int{4, 1}, script: []int{0, 1, 0}},
		{workers: 1, n: 2, m: 4, hashes: []int{1, 3}, script: []int{0, 1, 0}},
		{workers: 1, n: 2, m: 3, hashes: []int{4, 1}, script: []int{0, 1, 0}, cancel: true},
	} {
		t.Run(c.String(), func(t *testing.T) {
			t.Parallel()
			res := explore(c)
			if res.violation != "" {
				t.Fatalf("%s\nafter %d states, by these steps:\n  %s", res.violation, res.states, join(res.trace))
			}
			if res.terminals == 0 {
				t.Fatalf("no run of the model ends: %d states", res.states)
			}
			t.Logf("%d states, %d end states, no violation", res.states, res.terminals)
		})
	}
}

// Each safeguard of the design matters: removing it lets the model find a
// run that breaks an invariant.
func TestEachSafeguardIsNeeded(t *testing.T) {
	t.Parallel()
	base := config{workers: 1, n: 2, m: 3, hashes: []int{4, 1}, script: []int{0, 1, 0}}
	for _, c := range []config{
		with(base, func(c *config) { c.mut, c.crashes = noHead, 1 }),
		with(base, func(c *config) { c.mut, c.releases = noRowBound, 1 }),
		with(base, func(c *config) { c.mut = noFreeze }),
		with(base, func(c *config) { c.mut = ownBucketOnly }),
		with(base, func(c *config) { c.mut = drainEarly }),
	} {
		t.Run(c.mut.String(), func(t *testing.T) {
			t.Parallel()
			res := explore(c)
			if res.violation == "" {
				t.Fatalf("without %s the model still holds (%d states): the safeguard is not tested", c.mut, res.states)
			}
			t.Logf("found: %s\n  %s", res.violation, join(res.trace))
		})
	}
}

func with(c config, f func(*config)) config {
	f(&c)
	return c
}

func join(steps []string) string {
	out := ""
	for i, s := range steps {
		if i > 0 {
			out += "\n  "
		}
		out += s
	}
	return out
}
