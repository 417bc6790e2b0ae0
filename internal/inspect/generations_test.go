package inspect

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
)

// A subscription resized 8 → 4 and now resizing 4 → 6 has three
// generations: 0 retired (its N and cut from its checkpoints), 1 serving,
// 2 next; a generation beyond them, or below 0, is a *GenerationError.
func TestGenerations(t *testing.T) {
	t.Parallel()
	in := Inspection{Subscription: "orders", Buckets: 4,
		Resize: leasestore.Resize{Generation: 1, Buckets: 4, State: leasestore.ResizeSealing, NextBuckets: 6}}
	for b := range 8 {
		in.Checkpoints = append(in.Checkpoints, eventsource.Checkpoint{Bucket: eventsource.Slot(0, b), Position: 40})
	}
	in.Checkpoints = append(in.Checkpoints, eventsource.Checkpoint{Bucket: eventsource.Slot(1, 2), Position: 44})
	require.Equal(t, []Generation{
		{Generation: 0, Role: GenerationRetired, Buckets: 8, Cut: 40},
		{Generation: 1, Role: GenerationServing, Buckets: 4},
		{Generation: 2, Role: GenerationNext, Buckets: 6},
	}, in.Generations())
	require.Equal(t, 8, in.MaxBuckets())
	for _, g := range []int{3, -1} {
		_, err := in.Generation(g)
		require.ErrorIs(t, err, ErrNoGeneration)
		var ge *GenerationError
		require.ErrorAs(t, err, &ge)
		require.Equal(t, g, ge.Generation)
	}
	_, err := in.Generation(3)
	require.EqualError(t, err, `subscription "orders" has no generation 3 (its generations are 0 to 2)`)

	never := Inspection{Subscription: "fresh", Buckets: 2}
	require.Equal(t, []Generation{{Generation: 0, Role: GenerationServing, Buckets: 2}}, never.Generations())
	_, err = never.Generation(1)
	require.EqualError(t, err, `subscription "fresh" has no generation 1 (it has only generation 0: it was never resized)`)
}
