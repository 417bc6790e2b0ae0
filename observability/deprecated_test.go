package observability_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/observability"
)

// The former names ("members" for the live workers) still compile and mean
// what the new ones do.
func TestDeprecatedNamesMeanTheNewOnes(t *testing.T) {
	h := newHarness(t)
	require.Equal(t, observability.AttrLiveWorkers, observability.AttrMembers)

	_, pass := h.tel.StartReconcile(context.Background(), "orders", "w1")
	pass.End(observability.PassSummary{Members: 3, FairShare: 2, Owned: 2})
	rec := h.ended(observability.SpanReconcile)
	require.Len(t, rec, 1)
	require.EqualValues(t, 3, attrs(rec[0])[observability.AttrLiveWorkers], "a caller that sets Members still reports the live workers")

	unregister := h.tel.RegisterStatus(func() observability.SubscriptionStatus {
		return observability.SubscriptionStatus{Subscription: "orders", Worker: "w1", Buckets: 4, Members: 2}
	})
	defer unregister()
	st := h.tel.Status()
	require.Len(t, st, 1)
	require.Equal(t, 2, st[0].LiveWorkers)
	require.Equal(t, 2, st[0].Members)
}
