package coordplan

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/leasestore"
)

func lease(slot int, epoch int64) leasestore.Lease {
	return leasestore.Lease{Slot: slot, Epoch: epoch, Ready: true}
}

func only(acts []Action, k Kind) []Action {
	var out []Action
	for _, a := range acts {
		if a.Kind == k {
			out = append(out, a)
		}
	}
	return out
}

// A slot's handled mark is kept only while a pass reports it held at the
// mark's epoch and not newly claimed: a next generation's lease row
// deleted by a cancelled resize and made again starts its epochs over, so
// a new claim may repeat an epoch the mark was left at. The simulation's
// table never repeats an epoch, and cannot find a mark kept on a claim:
// this test covers it.
func TestAPassKeepsTheMarksOfTheHoldingsItReportsHeldOnly(t *testing.T) {
	s := New()
	res := leasestore.PassResult{Owned: []leasestore.Lease{lease(0, 3), lease(1, 1)}, Claimed: []leasestore.Lease{lease(1, 1)}}
	marks := only(s.Pass(res), ForgetMarks)
	require.Len(t, marks, 1)
	require.Equal(t, map[int]int64{0: 3}, marks[0].Keep, "slot 1, newly claimed, starts at its checkpoint")
	marks = only(s.Pass(leasestore.PassResult{Owned: []leasestore.Lease{lease(1, 1)}}), ForgetMarks)
	require.Equal(t, map[int]int64{1: 1}, marks[0].Keep, "slot 0, not reported, loses its mark")
}

// A report names the reader it is about: the end of a reader replaced
// since changes nothing of the reader that runs now.
func TestTheEndOfAReplacedReaderLeavesItsSuccessor(t *testing.T) {
	s := New()
	spawns := only(s.Pass(leasestore.PassResult{Owned: []leasestore.Lease{lease(0, 1)}}), Spawn)
	require.Len(t, spawns, 1)
	first := spawns[0].Reader
	require.Empty(t, s.Terminated(0, first))
	require.True(t, s.Readers[0].Stopping, "ended, its last messages still queued: nothing takes its place yet")
	require.Empty(t, only(s.Pass(leasestore.PassResult{Owned: []leasestore.Lease{lease(0, 1)}}), Spawn))
	spawns = only(s.Gone(0, first), Spawn)
	require.Len(t, spawns, 1, "gone: the slot, still held, gets its next reader")
	next := spawns[0].Reader
	require.NotEqual(t, first, next)
	require.Empty(t, s.Terminated(0, first))
	require.Empty(t, only(s.Gone(0, first), Spawn))
	require.Equal(t, next, s.Readers[0].ID)
	require.False(t, s.Readers[0].Stopping, "the old reader's end is not its successor's")
}

// A coordinator that stops or restarts stops its readers with it: their
// ends spawn nothing again (an Abort once waited out its timeout on the
// readers spawned anew). The actors' tests have no test of it; the
// simulation finds it (FaultHaltIgnored), and so does this.
func TestAHaltedCoordinatorSpawnsNoReaderAsItsReadersEnd(t *testing.T) {
	s := New()
	spawns := only(s.Pass(leasestore.PassResult{Owned: []leasestore.Lease{lease(0, 1)}}), Spawn)
	require.Len(t, spawns, 1)
	s.Halt()
	require.Empty(t, s.Terminated(0, spawns[0].Reader))
	require.Empty(t, s.Gone(0, spawns[0].Reader), "halted: nothing is spawned, stopped, drained or told")
	require.Empty(t, s.Readers)
}
