package leasestore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// A resize writes checkpoints twice — the cut as the new buckets'
// checkpoints when the last proposal decides it, and the cut as a drained
// slot's checkpoint — and each is bounded by the event store's head, like
// eventsource's own checkpoint writes: after a failover to a standby that
// lacked the last commits the head goes back, and a cut above it would
// skip the events that get those positions again. The head is moved back
// by hand here (eventsource's TestFailover shows it on a real standby).
func TestResizeCheckpointsAreBoundedByTheHead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupResize(t, 3)
	a := b.open(t, b.config(KindRow, 2, "a"))
	settle(t, []*Store{a}, 2)
	b.request(t, 3)
	settle(t, []*Store{a}, 5)
	lease := func(slot int) Lease {
		for _, l := range a.Held() {
			if l.Slot == slot {
				return l
			}
		}
		t.Fatalf("slot %d not held", slot)
		return Lease{}
	}
	b.setHead(t, 40)

	t.Run("AProposalFromACursorAboveTheHeadIsRefused", func(t *testing.T) {
		_, err := a.ProposeCut(ctx, 0, lease(0).Epoch, 50)
		var above *eventsource.CheckpointAboveHeadError
		require.ErrorAs(t, err, &above)
		require.ErrorIs(t, err, eventsource.ErrCheckpointAboveHead)
		require.Equal(t, eventsource.CheckpointAboveHeadError{Subscription: b.sub, Bucket: 0, Position: 50, Head: 40}, *above)
		require.EqualValues(t, -1, b.resize(t).Old[0].Proposal, "nothing was proposed")
	})

	bound, err := a.ProposeCut(ctx, 0, lease(0).Epoch, 30)
	require.NoError(t, err)
	require.EqualValues(t, 40, bound.Limit)
	b.setHead(t, 10) // the head goes back: slot 0's proposal is above it

	t.Run("ACutAboveTheHeadIsNotDecided", func(t *testing.T) {
		_, err := a.ProposeCut(ctx, 1, lease(1).Epoch, 5)
		var above *eventsource.CheckpointAboveHeadError
		require.ErrorAs(t, err, &above)
		require.Equal(t, eventsource.CheckpointAboveHeadError{Subscription: b.sub, Bucket: eventsource.Slot(1, 0),
			Position: 40, Head: 10}, *above)
		r := b.resize(t)
		require.Equal(t, ResizeSealing, r.State, "nothing was decided")
		require.False(t, r.CutDecided)
		require.EqualValues(t, -1, r.Old[1].Proposal, "the proposal went with the refused decision")
		for j := range 3 {
			require.EqualValues(t, -1, b.checkpoint(t, eventsource.Slot(1, j)), "new bucket %d has no checkpoint", j)
		}
	})

	b.setHead(t, 40)
	bound, err = a.ProposeCut(ctx, 1, lease(1).Epoch, 5)
	require.NoError(t, err)
	require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: 40, Decided: true}, bound)
	b.setHead(t, 10)

	t.Run("ADrainToACutAboveTheHeadIsRefused", func(t *testing.T) {
		err := a.Drain(ctx, 0, lease(0).Epoch, 40)
		var above *eventsource.CheckpointAboveHeadError
		require.ErrorAs(t, err, &above)
		require.Equal(t, eventsource.CheckpointAboveHeadError{Subscription: b.sub, Bucket: 0, Position: 40, Head: 10}, *above)
		require.EqualValues(t, -1, b.checkpoint(t, 0), "no checkpoint was written")
		require.False(t, b.resize(t).Old[0].Drained, "the slot is not drained")
	})

	b.setHead(t, 40)
	_, l := holding(t, []*Store{a}, 0) // the refused drain left the slot out of the view
	require.NoError(t, a.Drain(ctx, 0, l.Epoch, 40), "at the head, the drain goes through")
	require.EqualValues(t, 40, b.checkpoint(t, 0))
}
