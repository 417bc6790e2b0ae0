package coordplan

import (
	"fmt"
	"sort"

	"github.com/kumi-run/kumi/internal/resizepart"
	"github.com/kumi-run/kumi/leasestore"
)

// ID names one reader incarnation of a coordinator: the plan gives each
// [Spawn] the next. IDs only grow; 0 names no reader.
type ID uint64

// Reader is what the coordinator knows of one of its readers.
type Reader struct {
	ID    ID
	Epoch int64 // the holding it serves
	// Stopping: it was told to stop, or it stopped (its Terminated came,
	// its last messages may still be queued): nothing more is asked of it
	// and no other takes its place until it is gone.
	Stopping bool
	// Draining: it was asked to drain (a handoff, a leave). It holds the
	// lease until it hands over.
	Draining bool
	// Told is what it was last told of its slot's resize.
	Told resizepart.Told
}

// Kind is what an [Action] asks of the coordinator.
type Kind uint8

// The actions, in the order one input returns them.
const (
	// ForgetMarks: keep the handled mark (actors' handledMarks) only of
	// the slots in Keep, at the epoch given, and drop every other.
	ForgetMarks Kind = iota + 1
	// Forgot: the holding of Slot at Epoch was forgotten, its reader having
	// stopped on a lost or unsure lease (to log).
	Forgot
	// Released: the holding of Slot at Epoch ended, for Why (to record).
	Released
	// Stop the reader Reader of Slot.
	Stop
	// Drain asks the reader Reader of Slot to drain and stop.
	Drain
	// HandOver hands Slot over to its claimant (leasestore.Store.HandOver);
	// its end comes back as [State.HandedOver].
	HandOver
	// Spawn a reader for Lease, named Reader, starting from Told.
	Spawn
	// Tell the reader Reader of Slot the whole desired state of its
	// slot's resize, Told, for the holding at Epoch.
	Tell
	// Pass runs a lease pass (or one more after the one under way); its
	// result comes back as [State.Pass].
	Pass
	// Leave releases every lease and leaves the pool (leasestore's
	// Store.Leave): the coordinator has drained every reader and owns
	// nothing now.
	Leave
)

var kindNames = [...]string{"?", "forget-marks", "forgot", "released", "stop", "drain", "hand-over", "spawn", "tell",
	"pass", "leave"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Action is one thing the coordinator is to do; which fields it uses
// depends on its Kind.
type Action struct {
	Kind   Kind
	Slot   int
	Epoch  int64
	Reader ID
	Lease  leasestore.Lease // Spawn
	Told   resizepart.Told  // Spawn, Tell
	Keep   map[int]int64    // ForgetMarks: slot → epoch
	Why    string           // Released
}

func (a Action) String() string {
	switch a.Kind {
	case Spawn:
		return fmt.Sprintf("spawn r%d slot %d@%d", a.Reader, a.Slot, a.Epoch)
	case Stop, Drain, Tell:
		return fmt.Sprintf("%s r%d slot %d", a.Kind, a.Reader, a.Slot)
	case Forgot, Released:
		return fmt.Sprintf("%s slot %d@%d", a.Kind, a.Slot, a.Epoch)
	case HandOver:
		return fmt.Sprintf("hand-over slot %d", a.Slot)
	case ForgetMarks:
		return fmt.Sprintf("keep marks %v", a.Keep)
	}
	return a.Kind.String()
}

// State is what a coordinator knows. Its zero value is not ready: use
// [New]. The maps are the plan's own; read them, never write them.
type State struct {
	// Owned is, by slot, the holding the last pass reported (less what
	// ended since: a drain, a handover, a lost fence at its epoch).
	Owned map[int]leasestore.Lease
	// HandOff is the owned slots another worker claimed: drain their
	// reader, then hand them over.
	HandOff map[int]bool
	// Giving is the slots whose HandOver runs.
	Giving map[int]bool
	// Drained is, by slot, the epoch at which the old-generation slot's
	// reader drained it to the cut: that holding ended for good (a pass
	// that began before the drain may still report it held). The slot is
	// known by its epoch, not by the timing of passes: a cancel frees a
	// drained slot, and a pass after it may claim it again — at a new
	// epoch, a holding to serve — before any pass reported it gone.
	Drained map[int]int64
	// Readers is the coordinator's readers by slot, one at most each.
	Readers map[int]*Reader
	// Resize is the subscription's generation and resize as the last pass
	// read them.
	Resize leasestore.Resize
	// Leaving: the graceful stop began (drain every reader, then leave).
	// Left: the Leave was asked for.
	Leaving, Left bool
	// Halted: the coordinator stops or restarts; its readers stop with it
	// and none is spawned again.
	Halted bool
	last   ID
}

// New is the state of a coordinator that starts: it owns nothing.
func New() *State {
	return &State{Owned: map[int]leasestore.Lease{}, HandOff: map[int]bool{}, Giving: map[int]bool{},
		Drained: map[int]int64{}, Readers: map[int]*Reader{}}
}

// Pass takes a successful pass's result. A pass while leaving changes
// nothing: the readers drain, then the coordinator leaves.
func (s *State) Pass(res leasestore.PassResult) []Action {
	if s.Leaving {
		return nil
	}
	owned := map[int]leasestore.Lease{}
	reported := map[int]bool{}
	for _, l := range res.Owned {
		if e, ok := s.Drained[l.Slot]; ok && (e == l.Epoch || fault == FaultDrainedBySlot) {
			reported[l.Slot] = true // the drained holding, reported by a pass that began before the drain
			continue
		}
		owned[l.Slot] = l
	}
	for slot := range s.Drained {
		if !reported[slot] {
			delete(s.Drained, slot) // gone, or held again at a new epoch
		}
	}
	s.Owned = owned
	s.Resize = res.Resize
	for _, slot := range res.HandOff {
		s.HandOff[slot] = true
	}
	for slot := range s.HandOff {
		if _, ok := owned[slot]; !ok {
			delete(s.HandOff, slot)
		}
	}
	return append([]Action{s.keepMarks(res)}, s.sync()...)
}

// keepMarks keeps the handled mark of every slot a pass reports held at
// its epoch, unless newly claimed: the mark of a slot not held, held at
// another epoch or newly claimed is dropped, its next reader starting at
// the checkpoint. (A slot's epoch grows with every claim, but a next
// generation's lease row deleted by a cancelled resize and made again
// starts over: a new claim of it may repeat an epoch seen before.)
func (s *State) keepMarks(res leasestore.PassResult) Action {
	keep := map[int]int64{}
	for slot, l := range s.Owned {
		keep[slot] = l.Epoch
	}
	for _, l := range res.Claimed {
		delete(keep, l.Slot)
	}
	return Action{Kind: ForgetMarks, Keep: keep}
}

// LostFence takes a reader's report that it stopped on a lost or unsure
// lease of slot at epoch: the holding is forgotten, and no reader is
// spawned for the slot until a pass reports it held. A reader of an older
// epoch (one that had not yet stopped when the slot was claimed again)
// says nothing of the holding now. A pass follows.
func (s *State) LostFence(slot int, epoch int64) []Action {
	var out []Action
	if l, ok := s.Owned[slot]; ok && (l.Epoch == epoch || fault == FaultLostBySlot) && fault != FaultLostKept {
		delete(s.Owned, slot)
		out = append(out, Action{Kind: Forgot, Slot: slot, Epoch: l.Epoch})
	}
	return append(out, Action{Kind: Pass})
}

// CutDrained takes a reader's report that it drained slot, held at epoch,
// to the resize's cut: that holding ended for good. The reader stops
// itself; its end ([State.Gone]) removes it. A pass follows: the drain may
// have switched or completed the resize.
func (s *State) CutDrained(slot int, epoch int64) []Action {
	var out []Action
	if fault != FaultDrainedForgotten {
		s.Drained[slot] = epoch
	}
	if l, ok := s.Owned[slot]; ok && l.Epoch == epoch {
		// (A pass after a cancel may already have claimed the slot again,
		// at a new epoch: that holding stays.)
		delete(s.Owned, slot)
		delete(s.HandOff, slot)
		out = append(out, Action{Kind: Released, Slot: slot, Epoch: epoch, Why: "drained to the resize's cut"})
	}
	return append(out, Action{Kind: Pass})
}

// Terminated takes the end of the reader id of slot, which overtakes the
// reader's last messages, still queued (a cut drained, a lost fence, a
// drain). Acted on at once, the slot still owned at the reader's epoch, a
// reader would be spawned again for a slot just drained to the cut or
// lost. The coordinator acts on it behind them ([State.Gone]); meanwhile
// the reader counts as stopping, so nothing is asked of it and no other
// takes its place.
func (s *State) Terminated(slot int, id ID) []Action {
	r := s.Readers[slot]
	if r == nil || r.ID != id {
		return nil
	}
	if fault == FaultGoneAtTerminated {
		return s.Gone(slot, id)
	}
	r.Stopping = true
	return nil
}

// Gone forgets the reader id of slot, once its last messages were read,
// and brings the readers in line. What it handled stays in the slot's
// mark, for the slot's next reader at its epoch.
func (s *State) Gone(slot int, id ID) []Action {
	if r := s.Readers[slot]; r != nil && r.ID == id {
		delete(s.Readers, slot)
	}
	return append(s.sync(), s.maybeLeave()...)
}

// HandedOver takes the end of a slot's HandOver: given, it is owned no
// more; failed, the next pass retries. Either way the slot's handoff is
// over until a pass reports it again, and a pass follows.
func (s *State) HandedOver(slot int, given bool) []Action {
	delete(s.Giving, slot)
	if given {
		delete(s.Owned, slot)
	}
	delete(s.HandOff, slot)
	return append([]Action{{Kind: Pass}}, s.maybeLeave()...)
}

// BeginLeave begins the graceful stop: drain every reader, then release
// every lease and leave the pool, so other workers take over at once.
func (s *State) BeginLeave() []Action {
	if s.Leaving {
		return nil
	}
	s.Leaving = true
	var out []Action
	for _, slot := range sorted(s.Readers) {
		if r := s.Readers[slot]; !r.Draining && !r.Stopping {
			r.Draining = true
			out = append(out, Action{Kind: Drain, Slot: slot, Reader: r.ID})
		}
	}
	return append(out, s.maybeLeave()...)
}

// Halt is the first step of a stop or a restart: the readers stop with the
// coordinator, and none may be spawned again meanwhile.
func (s *State) Halt() {
	if fault != FaultHaltIgnored {
		s.Halted = true
	}
}

// maybeLeave leaves once leaving, every reader gone and no handover under
// way.
func (s *State) maybeLeave() []Action {
	if !s.Leaving || s.Left || len(s.Readers) > 0 || len(s.Giving) > 0 {
		return nil
	}
	s.Left = true
	var out []Action
	for _, slot := range sorted(s.Owned) {
		out = append(out, Action{Kind: Released, Slot: slot, Epoch: s.Owned[slot].Epoch, Why: "graceful stop"})
	}
	s.Owned, s.HandOff = map[int]leasestore.Lease{}, map[int]bool{}
	return append(out, Action{Kind: Leave})
}

// sync brings the readers in line with what is owned: stop readers of
// slots lost (or held at another epoch), drain readers of slots being
// handed off (and hand over those with no reader), spawn readers for owned
// ready slots without one, and tell every live reader its slot's desired
// state.
func (s *State) sync() []Action {
	if s.Halted {
		return nil
	}
	var out []Action
	for _, slot := range sorted(s.Readers) {
		r := s.Readers[slot]
		l, ok := s.Owned[slot]
		if (!ok || l.Epoch != r.Epoch) && !r.Stopping && !r.Draining {
			r.Stopping = true
			out = append(out, Action{Kind: Stop, Slot: slot, Reader: r.ID})
		}
	}
	for _, slot := range sorted(s.HandOff) {
		switch r := s.Readers[slot]; {
		case r == nil:
			if !s.Giving[slot] && !s.Leaving {
				s.Giving[slot] = true
				out = append(out, Action{Kind: HandOver, Slot: slot})
			}
		case !r.Draining && !r.Stopping:
			r.Draining = true
			out = append(out, Action{Kind: Drain, Slot: slot, Reader: r.ID})
		}
	}
	if s.Leaving {
		return out
	}
	for _, slot := range sorted(s.Owned) {
		l := s.Owned[slot]
		switch r := s.Readers[slot]; {
		case r == nil && !s.HandOff[slot] && l.Ready:
			// A next generation's slot waits, held, until ready.
			s.last++
			s.Readers[slot] = &Reader{ID: s.last, Epoch: l.Epoch, Told: s.ToldOf(l)}
			out = append(out, Action{Kind: Spawn, Slot: slot, Epoch: l.Epoch, Reader: s.last, Lease: l, Told: s.ToldOf(l)})
		case r != nil && !r.Stopping && r.Epoch == l.Epoch:
			// Level-triggered: the whole desired state, on every pass and
			// whenever it changes; a reader that missed a message
			// converges at the next. A draining reader (a handoff)
			// proposes too: it holds the lease until it hands over.
			if t := s.ToldOf(l); t != r.Told || fault != FaultToldOnce {
				r.Told = t
				out = append(out, Action{Kind: Tell, Slot: slot, Epoch: l.Epoch, Reader: r.ID, Told: t})
			}
		}
	}
	return out
}

// ToldOf is what the reader of a held slot is to know of the resize: the
// whole desired state, told on every pass (level-triggered). For a bucket
// of the serving generation while a resize runs, the resize by its id and
// the bound its lease row carried — its proposal, or the decided cut
// (every holding may deliver up to C, and no further) — or, while sealing
// without one, that it must propose; otherwise that the resize (the one in
// force, or the last) does not bound it.
func (s *State) ToldOf(l leasestore.Lease) resizepart.Told {
	t := resizepart.Told{Resize: s.Resize.ID}
	switch {
	case !s.Resize.Resizing() || l.Generation != s.Resize.Generation:
	case s.Resize.CutDecided:
		t.Active, t.Decided, t.Limit = true, true, s.Resize.Cut
	case l.Bound.Resizing && l.Bound.Decided:
		t.Active, t.Decided, t.Limit = true, true, l.Bound.Limit
	case l.Bound.Resizing:
		t.Active, t.Proposed, t.Limit = true, true, l.Bound.Limit
	default:
		t.Active = true // sealing, no proposal: propose one
	}
	return t
}

func sorted[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
