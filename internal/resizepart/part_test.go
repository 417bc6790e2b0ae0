package resizepart

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// kinds lists the kinds of effects, for comparisons.
func kinds(effects []Effect) []Kind {
	var out []Kind
	for _, e := range effects {
		out = append(out, e.Kind)
	}
	return out
}

// What the coordinator tells while the reader's proposal is out, and the
// proposal's answer, in either order and whatever their age: the reader
// ends bounded by the newest (the interleaving CI met in
// TestResizeLatency/row: the cut another proposal decided was told before
// the reader took its own, older answer, and the reader, dropping that
// news, stayed bounded by its proposal and never drained; likewise a
// cancel told while the proposal is out lifts the bound).
func TestTheNewestNewsWinsWhateverItsOrder(t *testing.T) {
	t.Parallel()
	sealing := Told{Resize: 1, Active: true}
	proposal := Told{Resize: 1, Active: true, Proposed: true, Limit: 240}
	cut := Told{Resize: 1, Active: true, Decided: true, Limit: 243}
	cancelled := Told{Resize: 1}
	for _, tc := range []struct {
		name   string
		told   []Told // while the proposal is out
		answer Answer
		want   Bound
	}{
		{"CutDecidedByAnother", []Told{proposal, cut}, Answer{Resize: 1, Active: true, Limit: 240}, Bound{Bounded: true, Limit: 243, Decided: true, Resize: 1}},
		{"CutThenAnOlderAnswer", []Told{cut}, Answer{Resize: 1, Active: true, Limit: 240}, Bound{Bounded: true, Limit: 243, Decided: true, Resize: 1}},
		{"AnswerDecidesItself", []Told{proposal}, Answer{Resize: 1, Active: true, Limit: 243, Decided: true}, Bound{Bounded: true, Limit: 243, Decided: true, Resize: 1}},
		{"CancelledMeanwhile", []Told{cancelled}, Answer{Resize: 1, Active: true, Limit: 240}, Bound{}},
		{"NothingTold", nil, Answer{Resize: 1, Active: true, Limit: 240}, Bound{Bounded: true, Limit: 240, Resize: 1}},
		{"TheAnswerSaysItIsOver", nil, Answer{Resize: 1}, Bound{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var p Part
			require.Equal(t, []Effect{{Kind: Propose, Resize: 1, Position: 235}, {Kind: BoundChanged}}, p.Tell(sealing, 235))
			require.Equal(t, Bound{Bounded: true, Limit: 235, Resize: 1}, p.Bound(), "frozen at the cursor")
			for _, m := range tc.told {
				require.Empty(t, kinds(p.Tell(m, 235)), "nothing done while the proposal is out")
			}
			p.Proposal(tc.answer, 235)
			require.NotEqual(t, Proposing, p.Phase())
			require.Equal(t, tc.want, p.Bound(), "%s", &p)
			// Told again what it knows: nothing changes.
			for _, m := range append(tc.told, sealing) {
				require.Empty(t, kinds(p.Tell(m, 235)), "%s", &p)
			}
		})
	}
}

// A reader bounded by a cancelled resize's cut, told the seal of the next
// resize before (or without) being told of the cancel, proposes for the
// next one (issue 24, fault 2: it took the seal for news it had, drained
// to the old cut, was refused, and went on unbounded without proposing:
// the next resize stayed sealing for good).
func TestASealForTheNextResizeReplacesTheOldCut(t *testing.T) {
	t.Parallel()
	var p Part
	p.Tell(Told{Resize: 1, Active: true, Decided: true, Limit: 50}, 40)
	require.Equal(t, Cut, p.Phase())
	effects := p.Tell(Told{Resize: 2, Active: true}, 47)
	require.Equal(t, []Effect{{Kind: Propose, Resize: 2, Position: 47}, {Kind: BoundChanged}}, effects)
	require.Equal(t, Bound{Bounded: true, Limit: 47, Resize: 2}, p.Bound())

	// With its drain to the old cut out, it waits for the drain's answer:
	// refused, it proposes for the next.
	p = Part{}
	p.Tell(Told{Resize: 1, Active: true, Decided: true, Limit: 50}, 50)
	require.Equal(t, []Effect{{Kind: Drain, Resize: 1, Position: 50}}, p.Progress(50, true))
	require.Empty(t, p.Tell(Told{Resize: 2, Active: true}, 52))
	require.Equal(t, []Effect{{Kind: Propose, Resize: 2, Position: 52}, {Kind: BoundChanged}}, p.DrainRefused(52))
}

// The answer of a proposal for a resize that was cancelled, and another
// requested since, is that resize's: it neither bounds the reader by the
// next one's cut nor lifts a bound the next one set (issue 24, fault 3).
func TestAnAnswerForAnOlderResizeChangesNothingOfTheNext(t *testing.T) {
	t.Parallel()
	var p Part
	p.Tell(Told{Resize: 1, Active: true}, 10)
	p.Tell(Told{Resize: 1}, 10)               // cancelled
	p.Tell(Told{Resize: 2, Active: true}, 12) // the next, sealing
	// The store refuses the proposal for 1 (ProposeCutFor): over.
	effects := p.Proposal(Answer{Resize: 1}, 12)
	require.Equal(t, []Effect{{Kind: Propose, Resize: 2, Position: 12}, {Kind: BoundChanged}}, effects)
	// Even an answer that (wrongly) carried the next one's cut, named as
	// the old one's, would not be taken for it.
	p.Proposal(Answer{Resize: 2, Active: true, Decided: true, Limit: 13}, 12)
	require.Equal(t, Bound{Bounded: true, Limit: 13, Decided: true, Resize: 2}, p.Bound())
	require.Empty(t, kinds(p.Tell(Told{Resize: 1}, 12)), "the older cancel lifts nothing")
	require.Equal(t, Bound{Bounded: true, Limit: 13, Decided: true, Resize: 2}, p.Bound())
}

// A drain waits until everything up to the cut is finished, is asked once,
// and its success ends the part.
func TestTheDrain(t *testing.T) {
	t.Parallel()
	var p Part
	p.Tell(Told{Resize: 3, Active: true, Decided: true, Limit: 20}, 0)
	require.Empty(t, p.Progress(19, true))
	require.Empty(t, p.Progress(20, false), "not while handing over")
	require.Equal(t, []Effect{{Kind: Drain, Resize: 3, Position: 20}}, p.Progress(25, true))
	require.Empty(t, p.Progress(25, true), "asked once")
	require.Equal(t, []Effect{{Kind: Drain, Resize: 3, Position: 20}}, p.Retry())
	require.Equal(t, []Effect{{Kind: Done, Resize: 3, Position: 20}}, p.DrainDone())
	require.Equal(t, Drained, p.Phase())
	require.Empty(t, p.Tell(Told{Resize: 4, Active: true}, 30), "a drained part takes nothing more")
}
