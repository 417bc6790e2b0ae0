package actors

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
)

// After a resize, /status and the per-bucket metrics name each bucket by
// its generation and its number within it (0 … N-1, as `kumi status`
// shows), with the store's entry beside it in /status; never by the slot
// alone (65536 and up), which no operator tool shows.
func TestStatusAndMetricsNameGenerationAndBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 8, 40)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })
	tel := observability.New(observability.Options{MeterProvider: mp, Logger: testLoggerOrDiscard()})
	rec := newRecorder()
	w := startTracedWorker(t, schema, "w", withLease(groupOpts("gens", 2, rec, "w"), resizeLease()), tel)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 40 }, "the first generation delivers")
	r, _ := resizeTo(t, store, "gens", 3)
	require.Equal(t, 1, r.Generation)
	seed(t, store, "acct", 8, 40)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 80 }, "the second generation delivers")

	var page observability.SubscriptionStatus
	pgtest.Eventually(t, waitLong, func() bool {
		page = w.group.g.statusSnapshot()
		return len(page.Owned) == 3
	}, "the worker owns the three new buckets (%+v)", observed(func() any { return page.Owned }))
	for _, b := range page.Owned {
		require.Equal(t, 1, b.Generation, "%+v", b)
		require.Less(t, b.Bucket, 3, "%+v", b)
		require.Equal(t, eventsource.Slot(1, b.Bucket), b.Slot, "%+v", b)
	}

	var rm metricdata.ResourceMetrics
	pgtest.Eventually(t, waitLong, func() bool {
		require.NoError(t, reader.Collect(ctx, &rm))
		gens := sums(rm, obsname.MetricLagEvents, obsname.AttrGeneration)
		_, one := gens["1"]
		return one && len(gens) == 1 && len(sums(rm, obsname.MetricLagEvents, obsname.AttrBucket)) == 3
	}, "the lag gauges are the new generation's")
	for bucket := range sums(rm, obsname.MetricLagEvents, obsname.AttrBucket) {
		n, err := strconv.Atoi(bucket)
		require.NoError(t, err)
		require.Less(t, n, 3, "kumi.bucket %q is a slot, not a bucket", bucket)
	}
	delivered := sums(rm, obsname.MetricEventsDelivered, obsname.AttrGeneration)
	require.GreaterOrEqual(t, delivered["0"], 40.0, "generation 0 delivered the first 40")
	require.GreaterOrEqual(t, delivered["1"], 40.0, "generation 1 the next 40")
	for bucket := range sums(rm, obsname.MetricEventsDelivered, obsname.AttrBucket) {
		n, err := strconv.Atoi(bucket)
		require.NoError(t, err)
		require.Less(t, n, 3, "kumi.bucket %q is a slot, not a bucket", bucket)
	}
}
