package eventsource_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

func TestSlot(t *testing.T) {
	t.Parallel()
	t.Run("GenerationZeroIsTheBucket", func(t *testing.T) {
		for _, b := range []int{0, 1, 7, eventsource.MaxGroupSize - 1} {
			require.Equal(t, b, eventsource.Slot(0, b))
			g, bb := eventsource.SlotBucket(b)
			require.Equal(t, 0, g)
			require.Equal(t, b, bb)
		}
	})
	t.Run("RoundTrip", func(t *testing.T) {
		for _, g := range []int{0, 1, 2, 1000, eventsource.MaxGeneration} {
			for _, b := range []int{0, 3, eventsource.MaxGroupSize - 1} {
				slot := eventsource.Slot(g, b)
				gg, bb := eventsource.SlotBucket(slot)
				require.Equal(t, [2]int{g, b}, [2]int{gg, bb}, "slot %d", slot)
			}
		}
		require.Equal(t, 65536+5, eventsource.Slot(1, 5))
	})
	t.Run("TheLastSlotFitsAnInteger", func(t *testing.T) {
		require.Equal(t, math.MaxInt32, eventsource.Slot(eventsource.MaxGeneration, eventsource.MaxGroupSize-1))
	})
	t.Run("OutOfRangePanics", func(t *testing.T) {
		for _, c := range [][2]int{{-1, 0}, {eventsource.MaxGeneration + 1, 0}, {0, -1}, {0, eventsource.MaxGroupSize}} {
			require.Panics(t, func() { eventsource.Slot(c[0], c[1]) }, "%v", c)
		}
		require.Panics(t, func() { eventsource.SlotBucket(-1) })
	})
}
