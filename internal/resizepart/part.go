// Package resizepart is a bucket reader's part in a resize
// (docs/design/resize.md) as a pure, synchronous state machine: no goroutines, no
// clock, no database. The reader actor (actors/resize_reader.go) feeds it
// events — what its coordinator tells of the slot, a proposal's answer, a
// drain's answer, how far the reader has finished its events — and carries
// out the effects it returns: propose a cut, drain to the cut, a bound
// changed, drained. One [Phase] holds what the reader is doing; the bound
// it may deliver up to follows from it ([Part.Bound]).
//
// # Identity, and level-triggered telling
//
// Everything the machine learns names the resize it belongs to, by its id
// (leasestore's Resize.ID, one per request, only growing): what is known
// of a slot is ordered by (resize, stage), stage going from in force to
// decided to over, so an older piece of news — a cancel told while a
// proposal was out, the answer of a proposal for a resize that was
// cancelled since — is recognised by what it is, whatever the order it
// arrives in, and changes nothing. The coordinator tells the whole desired
// state of the slot on every pass ([Told]), not a change once: a reader
// that missed a message converges at the next pass, and telling it again
// is a no-op.
package resizepart

import "fmt"

// Told is the desired state of one slot's resize, as its coordinator's
// pass read it: the resize in force (or the last one) by its id, and
// whether it bounds this slot — the slot is of the generation it drains —
// with the slot's proposal or the decided cut.
type Told struct {
	// Resize is the id of the resize in force, or of the last one (0: the
	// subscription was never resized).
	Resize int64
	// Active: the resize is in force and the slot is of its old
	// generation. False: it does not bound the slot (cancelled, completed,
	// or the slot is of another generation).
	Active bool
	// Proposed: the slot's row carries a proposal, Limit. Decided: the
	// cut is decided, Limit is C. Neither (while Active): the resize is
	// sealing and the slot has no proposal — propose one.
	Proposed, Decided bool
	Limit             int64
}

// stage orders what is known of one resize.
type stage uint8

const (
	stageInForce stage = iota + 1 // sealing, a proposal known or not
	stageDecided                  // the cut is decided
	stageOver                     // it bounds the slot no longer
)

// knowledge is the newest that is known of the slot's resize.
type knowledge struct {
	resize   int64
	stage    stage
	proposed bool  // stageInForce: a proposal is known (limit)
	limit    int64 // the proposal, or the cut
}

func (t Told) knowledge() knowledge {
	switch {
	case !t.Active:
		return knowledge{resize: t.Resize, stage: stageOver}
	case t.Decided:
		return knowledge{resize: t.Resize, stage: stageDecided, limit: t.Limit}
	}
	return knowledge{resize: t.Resize, stage: stageInForce, proposed: t.Proposed, limit: t.Limit}
}

// newer reports whether k is news beside known: a later resize, or a later
// stage of the same one.
func (k knowledge) newer(known knowledge) bool {
	return k.resize > known.resize || (k.resize == known.resize && k.stage > known.stage)
}

// merge folds k into known: the newer wins; news of the same stage of
// in-force adds a proposal (proposals only grow).
func (known knowledge) merge(k knowledge) knowledge {
	switch {
	case k.newer(known):
		return k
	case k.resize == known.resize && k.stage == known.stage && k.stage == stageInForce && k.proposed:
		known.limit = max(known.limit, k.limit)
		if !known.proposed {
			known.limit = k.limit
		}
		known.proposed = true
	}
	return known
}

// Phase is what the reader does in its slot's resize.
type Phase uint8

// The phases.
const (
	// Free: no resize bounds the reader.
	Free Phase = iota
	// Proposing: frozen at its cursor, its proposal for Resize is out.
	Proposing
	// Proposed: bounded by its slot's proposal, it waits for the cut.
	Proposed
	// Cut: bounded by the decided cut; it reads and finishes every event
	// up to it, then drains.
	Cut
	// Draining: its drain to the cut is out.
	Draining
	// Drained: its slot is drained to the cut; the reader stops.
	Drained
)

func (p Phase) String() string {
	switch p {
	case Free:
		return "free"
	case Proposing:
		return "proposing"
	case Proposed:
		return "proposed"
	case Cut:
		return "cut"
	case Draining:
		return "draining"
	case Drained:
		return "drained"
	}
	return fmt.Sprintf("Phase(%d)", uint8(p))
}

// Bound is how far the reader may deliver.
type Bound struct {
	// Bounded: a resize bounds the reader; false: it delivers without
	// bound.
	Bounded bool
	// Limit is the last position it may deliver, with Bounded.
	Limit int64
	// Decided: Limit is the decided cut (the reader reads through it).
	Decided bool
	// Resize is the id of the resize the bound belongs to, with Bounded.
	Resize int64
}

// Kind is the kind of an [Effect].
type Kind uint8

// The effects.
const (
	// Propose a cut for resize Resize at Position, the reader's cursor
	// (leasestore's ProposeCutFor); answer with [Part.Proposal].
	Propose Kind = iota + 1
	// Drain the slot to the cut Position of resize Resize (leasestore's
	// DrainCutTx); answer with [Part.DrainDone] or [Part.DrainRefused].
	Drain
	// BoundChanged: the reader's bound is now [Part.Bound]: deliver what
	// it lets through; when decided, read through it; when lifted, read
	// again from the cursor (live batches may have been dropped).
	BoundChanged
	// Done: the slot is drained to the cut Position: report it and stop.
	Done
)

// Effect is something the reader must do.
type Effect struct {
	Kind     Kind
	Resize   int64
	Position int64
}

func (e Effect) String() string {
	switch e.Kind {
	case Propose:
		return fmt.Sprintf("propose(resize %d, at %d)", e.Resize, e.Position)
	case Drain:
		return fmt.Sprintf("drain(resize %d, to %d)", e.Resize, e.Position)
	case BoundChanged:
		return "bound-changed"
	case Done:
		return fmt.Sprintf("done(%d)", e.Position)
	}
	return fmt.Sprintf("Effect(%d)", e.Kind)
}

// Answer is a proposal's answer: the bound the store returned, naming its
// resize (leasestore's Bound).
type Answer struct {
	Resize int64
	// Active: the resize answered is in force and bounds the slot; false:
	// it is over (cancelled, or another in force).
	Active  bool
	Limit   int64 // the slot's proposal, or the cut when Decided
	Decided bool
}

// Part is one reader's part in its slot's resizes. The zero value is a
// reader that knows of no resize.
type Part struct {
	phase  Phase
	resize int64 // the resize of the phase (not Free)
	limit  int64 // Proposing: the freeze; Proposed: the proposal; Cut, Draining, Drained: the cut
	known  knowledge
}

// Phase is what the reader does.
func (p *Part) Phase() Phase { return p.phase }

// Bound is how far the reader may deliver now.
func (p *Part) Bound() Bound {
	switch p.phase {
	case Free:
		return Bound{}
	case Proposing, Proposed:
		return Bound{Bounded: true, Limit: p.limit, Resize: p.resize}
	}
	return Bound{Bounded: true, Limit: p.limit, Decided: true, Resize: p.resize}
}

// Beyond reports whether the event at pos lies beyond the bound: it may not
// be delivered (yet).
func (p *Part) Beyond(pos int64) bool {
	return p.phase != Free && pos > p.limit
}

// String describes the machine, for traces and failure reports.
func (p *Part) String() string {
	return fmt.Sprintf("%s(resize %d, limit %d; known resize %d stage %d proposed %v limit %d)", p.phase, p.resize,
		p.limit, p.known.resize, p.known.stage, p.known.proposed, p.known.limit)
}

// Tell takes what the coordinator tells of the slot; cursor is the
// reader's cursor (where a freeze would hold it). Telling the same again
// changes nothing.
func (p *Part) Tell(t Told, cursor int64) []Effect {
	p.known = p.known.merge(t.knowledge())
	return p.settle(cursor, nil)
}

// knowledge is what an answer tells of its resize.
func (a Answer) knowledge() knowledge {
	switch {
	case a.Active && a.Decided:
		return knowledge{resize: a.Resize, stage: stageDecided, limit: a.Limit}
	case a.Active:
		return knowledge{resize: a.Resize, stage: stageInForce, proposed: true, limit: a.Limit}
	}
	return knowledge{resize: a.Resize, stage: stageOver}
}

// Proposal takes the answer of the proposal the machine asked for
// ([Propose]). An answer while no proposal is out (a restarted reader's
// predecessor's) changes nothing.
//
// The answer is merged into what is known, not put in its place: news
// told while the proposal was out (a cut another proposal decided, a
// cancel, a newer resize) may be newer than the answer. Replacing it
// would be safe — the answer is true news of the resize proposed for, as
// the store ran the proposal, and it names that resize (ProposeCutFor
// answers of no other), so the machine would only be where it would have
// been had the answer come before that news: bounded by its proposal or
// by that resize's cut, or free once that resize is over — and no newer
// resize's cut can be decided without a proposal of this slot, which
// this holding makes only after the answer. What it would lose is the
// newer news, until the coordinator's next pass tells it again: it tells
// the whole desired state on every pass. The merge keeps the reader right
// without that pass; the simulation finds the replacement only together
// with a coordinator that tells each change once (its
// mutAnswerOverridesToldOnce).
func (p *Part) Proposal(a Answer, cursor int64) []Effect {
	if p.phase != Proposing {
		return nil
	}
	k := a.knowledge()
	if a.Resize == p.resize || k.newer(p.known) {
		p.known = p.known.merge(k)
	}
	before := p.Bound()
	p.phase = Free
	return p.settle(cursor, &before)
}

// Retry is the effect to repeat after the outstanding proposal or drain
// failed on a transient error, if one is out.
func (p *Part) Retry() []Effect {
	switch p.phase {
	case Proposing:
		return []Effect{{Kind: Propose, Resize: p.resize, Position: p.limit}}
	case Draining:
		return []Effect{{Kind: Drain, Resize: p.resize, Position: p.limit}}
	}
	return nil
}

// Progress takes how far the reader has finished: every event of its
// bucket up to finished is read and done (acked or dead-lettered, no
// retry left), and draining tells whether the reader may drain to the
// cut now (it is not stopping or handing over). In phase Cut, once
// finished reaches the cut, it drains.
func (p *Part) Progress(finished int64, mayDrain bool) []Effect {
	if p.phase != Cut || !mayDrain || finished < p.limit {
		return nil
	}
	p.phase = Draining
	return []Effect{{Kind: Drain, Resize: p.resize, Position: p.limit}}
}

// DrainDone takes a drain's success: the slot is drained.
func (p *Part) DrainDone() []Effect {
	if p.phase != Draining {
		return nil
	}
	p.phase = Drained
	return []Effect{{Kind: Done, Resize: p.resize, Position: p.limit}}
}

// DrainRefused takes a drain refused because its resize is no longer at
// that cut (leasestore's ErrNoResize): that resize is over for the slot.
func (p *Part) DrainRefused(cursor int64) []Effect {
	if p.phase != Draining {
		return nil
	}
	p.known = p.known.merge(knowledge{resize: p.resize, stage: stageOver})
	before := p.Bound()
	p.phase = Free
	return p.settle(cursor, &before)
}

// settle moves the machine to what it knows, from a phase with nothing
// out, and returns the effects: a proposal to make, and whether the bound
// changed (from before, or from the bound at the call when nil).
func (p *Part) settle(cursor int64, before *Bound) []Effect {
	var b Bound
	if before != nil {
		b = *before
	} else {
		b = p.Bound()
	}
	var out []Effect
	k := p.known
	switch p.phase {
	case Proposed, Cut:
		if k.resize != p.resize || k.stage == stageOver {
			p.phase = Free // its resize is over: a newer one is settled below
		}
	}
	switch p.phase {
	case Free:
		switch {
		case k.stage == stageDecided:
			p.phase, p.resize, p.limit = Cut, k.resize, k.limit
		case k.stage == stageInForce && k.proposed:
			p.phase, p.resize, p.limit = Proposed, k.resize, k.limit
		case k.stage == stageInForce:
			// Sealing, and no proposal for the slot: freeze at the cursor
			// and propose.
			p.phase, p.resize, p.limit = Proposing, k.resize, cursor
			out = append(out, Effect{Kind: Propose, Resize: k.resize, Position: cursor})
		}
	case Proposed:
		switch {
		case k.stage == stageDecided:
			p.phase, p.limit = Cut, k.limit
		case k.proposed:
			p.limit = max(p.limit, k.limit)
		}
	}
	if p.Bound() != b {
		out = append(out, Effect{Kind: BoundChanged})
	}
	return out
}
