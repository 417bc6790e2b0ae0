package eventsource_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// A byte-bounded read stops after the event that reaches its bound, returns
// at least one event, and paging on from its last event reads every event
// once, in order.
func TestReadsBoundedInBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	const n = 20
	payload := strings.Repeat("x", 10_000)
	for i := range n {
		mustAppend(t, s, fmt.Sprintf("big-%d", i%3), ev("Big", fmt.Sprintf(`{"i":%d,"p":%q}`, i, payload)))
	}
	sequenceAll(t, s)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 1))

	all, err := s.ReadAll(ctx, 0, 100)
	require.NoError(t, err)
	require.Len(t, all, n)
	size := all[0].Size()
	require.Greater(t, size, int64(10_000))

	reads := map[string]func(after int64, limit int, maxBytes int64) ([]eventsource.RecordedEvent, error){
		"ReadAllBounded": func(after int64, limit int, maxBytes int64) ([]eventsource.RecordedEvent, error) {
			return s.ReadAllBounded(ctx, after, limit, maxBytes)
		},
		"ReadBucketBounded": func(after int64, limit int, maxBytes int64) ([]eventsource.RecordedEvent, error) {
			return s.ReadBucketBounded(ctx, "big", 0, 1, after, limit, maxBytes)
		},
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			// 2.5 events' worth: the third event reaches the bound.
			page, err := read(0, 100, 5*size/2)
			require.NoError(t, err)
			require.Len(t, page, 3)

			// A bound below one event still returns one.
			page, err = read(0, 100, 1)
			require.NoError(t, err)
			require.Len(t, page, 1)

			// The event limit still applies; 0 bytes means no byte bound.
			page, err = read(0, 5, 0)
			require.NoError(t, err)
			require.Len(t, page, 5)

			var got []int64
			for after := int64(0); ; {
				page, err := read(after, 100, 4*size)
				require.NoError(t, err)
				if len(page) == 0 {
					break
				}
				var bytes int64
				for _, e := range page[:len(page)-1] {
					bytes += e.Size()
				}
				require.Less(t, bytes, 4*size, "no event after the one that reaches the bound")
				for _, e := range page {
					got = append(got, e.Position)
				}
				after = page[len(page)-1].Position
			}
			want := make([]int64, 0, n)
			for _, e := range all {
				want = append(want, e.Position)
			}
			require.Equal(t, want, got)
		})
	}
}
