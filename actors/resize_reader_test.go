package actors

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/leasestore"
)

// TestReaderTakesTheCutDecidedWhileItsProposalIsOut replays, on a reader's
// resize state, the interleaving CI met (TestResizeLatency/row: old bucket
// 6 never drained, the resize stuck in switched): the reader's proposal
// commits without completing the set; another reader's proposal completes
// it and decides the cut; the coordinator's pass reads the cut and tells
// the reader — before the reader has taken its own proposal's answer,
// which is older and carries only the proposal. The coordinator tells a
// reader of a change once, so a reader that dropped that news stayed
// bounded by its proposal, never learnt of the cut and never drained.
// Likewise a cancel told while the proposal is out must lift the bound.
func TestReaderTakesTheCutDecidedWhileItsProposalIsOut(t *testing.T) {
	t.Parallel()
	proposal := leasestore.Bound{Resizing: true, Limit: 240}
	cut := leasestore.Bound{Resizing: true, Limit: 243, Decided: true}
	for _, tc := range []struct {
		name   string
		told   []resizeBound // the coordinator's news while the proposal is out
		answer leasestore.Bound
		want   leasestore.Bound
	}{
		{"CutDecidedByAnother", []resizeBound{{bound: proposal}, {bound: cut}}, proposal, cut},
		{"CutThenAnOlderAnswer", []resizeBound{{bound: cut}}, proposal, cut},
		{"AnswerDecidesItself", []resizeBound{{bound: proposal}}, cut, cut},
		{"CancelledMeanwhile", []resizeBound{{}}, proposal, leasestore.Bound{}},
		{"NothingTold", nil, proposal, proposal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Not ready (its checkpoint not yet loaded), as a reader that
			// started on a sealing resize is: nothing here needs its actor.
			// Frozen at its cursor, its proposal out (what propose sets
			// before it calls ProposeCut off the mailbox).
			r := &reader{g: &group{logger: slog.New(slog.DiscardHandler)}, bucket: 6, cursor: 235,
				proposing: true, bound: leasestore.Bound{Resizing: true, Limit: 235}}
			for _, m := range tc.told {
				r.onResizeBound(nil, &m)
			}
			r.onProposed(nil, &proposed{gen: r, bound: tc.answer})
			require.False(t, r.proposing)
			require.Equal(t, tc.want, r.bound, "the reader's bound after the news %+v and the answer %+v", tc.told, tc.answer)
		})
	}
}
