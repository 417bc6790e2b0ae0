package actors

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
)

// The runtime reports its sequencer as the kumi.sequencer.* metrics while
// it runs, and stops reporting it when it stops.
func TestRuntimeReportsItsSequencer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := newTestStore(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })
	tel := observability.New(observability.Options{MeterProvider: mp, Logger: testLoggerOrDiscard()})
	rt, err := startedRuntime(ctx, quietSystem(), store, RuntimeOptions{Telemetry: tel})
	require.NoError(t, err)
	_, err = store.Append(ctx, "acct-1", eventsource.Any, []eventsource.EventData{{Type: "A", Data: []byte(`{}`)}})
	require.NoError(t, err)

	var rm metricdata.ResourceMetrics
	pgtest.Eventually(t, waitLong, func() bool {
		h, err := store.HeadPosition(ctx)
		return err == nil && h == 1
	}, "sequenced")
	require.NoError(t, reader.Collect(ctx, &rm))
	require.Equal(t, map[string]float64{"": 5000}, sums(rm, obsname.MetricSequencerBatch, "")) // a full step
	require.Equal(t, map[string]float64{"": 0}, sums(rm, obsname.MetricSequencerStuck, ""))
	require.Equal(t, map[string]float64{"": 0}, sums(rm, obsname.MetricSequencerResets, ""))
	require.Equal(t, map[string]float64{"": 0}, sums(rm, obsname.MetricSequencerStranded, ""))
	require.Equal(t, map[string]float64{"": 0}, sums(rm, obsname.MetricStoreServerChanges, ""))

	// A head below a position this process saw is a change of server (as
	// after a failover to a standby that lacks the last commits).
	store.SawPosition(50)
	_, err = store.CheckServer(ctx)
	require.NoError(t, err)
	require.NoError(t, reader.Collect(ctx, &rm))
	require.Equal(t, map[string]float64{"": 1}, sums(rm, obsname.MetricStoreServerChanges, ""))

	require.NoError(t, rt.Stop(ctx))
	require.NoError(t, reader.Collect(ctx, &rm))
	require.Empty(t, sums(rm, obsname.MetricSequencerBatch, ""), "gone once stopped")
}
