package actors

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// A runtime stops its groups together: eight idle groups stop while a
// ninth waits for its handler, which ignores its context (before, the
// groups stopped one after another, so a process of K groups took the sum
// of their stops — 4 workers × 50 subscriptions under load missed their
// 30 s — and every group behind a stuck one waited for it).
func TestRuntimeStopsItsGroupsTogether(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := newTestStore(t)
	seed(t, store, "stuck", 1, 1)
	rt, err := startedRuntime(ctx, quietSystem(), store, RuntimeOptions{Logger: testLogger()})
	require.NoError(t, err)
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	stuck, err := rt.StartGroup(ctx, GroupOptions{Subscription: "stuck", Category: "stuck", Buckets: 1, Lease: fastLease(),
		HandlerTimeout: time.Hour,
		Handler: Func(func(context.Context, *Delivery) error {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release // deaf to its context
			return nil
		})})
	require.NoError(t, err)
	var idle []*Group
	for i := range 8 {
		g, err := rt.StartGroup(ctx, GroupOptions{Subscription: fmt.Sprintf("idle-%d", i), Category: "idle", Buckets: 2,
			Lease: fastLease(), Handler: Func(func(context.Context, *Delivery) error { return nil })})
		require.NoError(t, err)
		idle = append(idle, g)
	}
	<-entered
	stopped := make(chan error, 1)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	go func() { stopped <- rt.Stop(sctx) }()
	pgtest.Eventually(t, 2*time.Minute, func() bool {
		for _, g := range idle {
			select {
			case <-g.Done():
			default:
				return false
			}
		}
		return true
	}, "every idle group stopped while the stuck one waits for its handler")
	select {
	case <-stuck.Done():
		t.Fatal("the stuck group stopped before its handler returned")
	default:
	}
	close(release)
	require.NoError(t, <-stopped)
	for _, g := range idle {
		require.NoError(t, g.Err())
	}
}
