package console

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/leasestore"
)

// During a resize the console's state carries it — the state, the next
// count, a line saying where it stands — and both generations' buckets,
// named for people ("g1/5"), the new ones on standby until their old ones
// drained; the relinquish action takes the slot the map carries.
func TestStateShowsAResize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	w := f.lease(t, "orders", "worker-a", 4)
	_, srv := f.serve(t, Options{})
	require.NoError(t, f.store.EnsureConsumerGroupIndex(ctx, 8))
	_, err := leasestore.RequestResize(ctx, f.store.Pool(), f.schema, leasestore.ResizeRequest{Subscription: "orders", Buckets: 8})
	require.NoError(t, err)
	_, err = w.Pass(ctx)
	require.NoError(t, err)

	r := get(t, srv, "/api/s/orders")
	require.Equal(t, http.StatusOK, r.status, r.body)
	st := decode[State](t, r.body)
	require.Equal(t, 4, st.Buckets)
	require.Equal(t, 0, st.Generation)
	require.NotNil(t, st.Resize)
	require.Equal(t, "sealing", st.Resize.State)
	require.Equal(t, 8, st.Resize.NextBuckets)
	require.Nil(t, st.Resize.Cut)
	require.Contains(t, st.Resize.Text, "resizing 4 → 8 buckets (generation 0 → 1), sealing, cut not decided")
	require.Len(t, st.Rows, 12)
	labels := map[string]Bucket{}
	for _, b := range st.Rows {
		labels[b.Label] = b
	}
	require.Equal(t, 3, labels["3"].Bucket)
	require.False(t, labels["3"].Standby)
	g15 := labels["g1/5"]
	require.Equal(t, 65536+5, g15.Bucket, "the slot")
	require.Equal(t, 1, g15.Generation)
	require.True(t, g15.Standby)
	require.Equal(t, "worker-a", g15.Owner)
}
