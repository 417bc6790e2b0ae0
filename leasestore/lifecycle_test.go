package leasestore

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/internal/startstop/startstoptest"
	"github.com/kumi-run/kumi/kumierr"
)

// Every kind's Store keeps kumi's lifecycle contract (docs/design/architecture.md,
// "Lifecycle"), with a notifier of its own and without one.
func TestLifecycleContract(t *testing.T) {
	t.Parallel()
	for _, k := range leaseKinds {
		t.Run(k.kind.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for name, noListen := range map[string]bool{"OwnNotifier": false, "NoListen": true} {
				t.Run(name, func(t *testing.T) {
					startstoptest.Stress(t, func(t *testing.T) startstop.Service {
						cfg := b.config(k.kind, 4, "")
						cfg.NoListen = noListen
						s, err := New(b.pool, cfg)
						require.NoError(t, err)
						return s
					})
				})
			}
		})
	}
}

// A store made by NewStore does nothing until Start: it has not joined,
// and its methods say so; once stopped they say that.
func TestAStoreWorksBetweenStartAndStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	other := b.open(t, b.config(KindRow, 4, "other"))
	s, err := New(b.pool, b.config(KindRow, 4, "s"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(ctx) })

	_, err = s.Pass(ctx)
	require.ErrorIs(t, err, ErrNotStarted)
	require.ErrorIs(t, s.EnsureBuckets(ctx), ErrNotStarted)
	require.ErrorIs(t, s.Leave(ctx), ErrNotStarted)
	require.Equal(t, 1, pass(t, other).Live, "a store not started has not joined")

	startCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, s.Start(startCtx))
	cancel() // bounds the start only
	require.Equal(t, 2, pass(t, s).Live)
	require.Equal(t, 2, pass(t, other).Live)

	require.NoError(t, s.Stop(ctx))
	_, err = s.Pass(ctx)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, s.Start(ctx), kumierr.ErrStopped)
	require.NoError(t, s.Stop(context.Background()), "Close is Stop")
}
