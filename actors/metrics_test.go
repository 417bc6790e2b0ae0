package actors

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
)

// sums adds up a metric's data points by one attribute's value ("" for all).
func sums(rm metricdata.ResourceMetrics, name, key string) map[string]float64 {
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			label := func(set attribute.Set) string {
				if key == "" {
					return ""
				}
				v, _ := set.Value(attribute.Key(key))
				return v.String()
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[label(p.Attributes)] += float64(p.Value)
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					out[label(p.Attributes)] += p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[label(p.Attributes)] += float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[label(p.Attributes)] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[label(p.Attributes)] += float64(p.Count)
				}
			}
		}
	}
	return out
}

// A scripted scenario, and the metrics it must leave: ownership, deliveries
// by outcome, handler durations, lease operations, buckets owned, lag.
func TestMetricsOfAScriptedScenario(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 4, 20)
	_, err := store.Append(ctx, "acct-9", eventsource.Any, []eventsource.EventData{{Type: "Poison", Data: []byte(`{}`)}})
	require.NoError(t, err)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })
	tel := observability.New(observability.Options{MeterProvider: mp, Logger: testLoggerOrDiscard()})
	rec := newRecorder()
	handler := actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			if d.Event.Type == "Poison" {
				ctx.Respond(Retry{Reason: "poison"})
				return
			}
			rec.end("w", d.Event)
			ctx.Respond(Ack{})
		}
	})
	o := groupOpts("metrics", 2, nil, "w")
	o.Handler, o.Retry = handler, fastRetry(2)
	w := startTracedWorker(t, schema, "w", o, tel)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 20 }, "all good events handled (got %d)", observed(rec.distinct))
	pgtest.Eventually(t, waitLong, func() bool {
		dls, _ := store.DeadLetters(ctx, "metrics", eventsource.DeadLetterFilter{})
		return len(dls) == 1
	}, "the poison event is dead-lettered")

	var rm metricdata.ResourceMetrics
	pgtest.Eventually(t, waitLong, func() bool {
		require.NoError(t, reader.Collect(ctx, &rm))
		return sums(rm, obsname.MetricBucketsOwned, "")[""] == 2 &&
			sums(rm, obsname.MetricEventsAcked, "")[""] == 20
	}, "gauges and counters settle")
	require.Equal(t, 22.0, sums(rm, obsname.MetricEventsDelivered, "")[""], "20 good + the poison twice")
	require.Equal(t, 1.0, sums(rm, obsname.MetricEventsRetried, obsname.AttrOutcome)["retry"])
	require.Equal(t, 1.0, sums(rm, obsname.MetricEventsDeadLettered, "")[""])
	require.Equal(t, 22.0, sums(rm, obsname.MetricHandlerDuration, "")[""])
	require.Equal(t, 2.0, sums(rm, obsname.MetricOwnershipChanges, obsname.AttrChange)["claim"])
	require.Positive(t, sums(rm, obsname.MetricLeaseOperations, obsname.AttrOperation)["renew"])
	require.Contains(t, sums(rm, obsname.MetricLagEvents, obsname.AttrBucket), "0")
	w.stop(t)
}
