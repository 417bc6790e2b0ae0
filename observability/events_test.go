package observability_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/kumi-run/kumi/observability"
)

func TestFetchSpans(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	fctx, f := h.tel.StartPublisherFetch(ctx, 100, 3)
	h.tel.Overflow(fctx, observability.OverflowInfo{Subscription: "orders", Bucket: 1, Policy: observability.PolicyPauseAndResume, Depth: 64, Capacity: 64, Dropped: 64})
	f.End(10, 110, nil)
	_, f = h.tel.StartPublisherFetch(ctx, 110, 3)
	f.End(0, 0, errors.New("conn reset"))
	_, f = h.tel.StartReaderFetch(ctx, "orders", 2, 50)
	f.End(4, 57, nil)

	pub := h.ended(observability.SpanPublisherFetch)
	require.Len(t, pub, 2)
	a := attrs(pub[0])
	assert.EqualValues(t, 100, a[observability.AttrFrom])
	assert.EqualValues(t, 110, a[observability.AttrLast])
	assert.EqualValues(t, 10, a[observability.AttrCount])
	assert.EqualValues(t, 10, a[observability.AttrMessagingBatchCount])
	assert.EqualValues(t, 3, a[observability.AttrSubscribers])
	assert.Equal(t, "receive", a[observability.AttrMessagingOperationType])
	assert.Equal(t, trace.SpanKindConsumer, pub[0].SpanKind)
	require.Len(t, pub[0].Events, 1, "the overflow is an event of the fetch that caused it")
	assert.Equal(t, observability.EventOverflow, pub[0].Events[0].Name)
	assert.NotContains(t, attrs(pub[1]), observability.AttrLast)
	assert.Equal(t, codes.Error, pub[1].Status.Code)
	assert.Empty(t, h.ended(observability.SpanOverflow))

	rd := h.ended(observability.SpanReaderFetch)
	require.Len(t, rd, 1)
	a = attrs(rd[0])
	assert.Equal(t, "orders", a[observability.AttrSubscription])
	assert.EqualValues(t, 2, a[observability.AttrBucket])
	assert.Equal(t, "reader", a[observability.AttrSource])

	ms := h.collect(t)
	assert.EqualValues(t, 10, sum(t, ms, observability.MetricFetchEvents, map[string]any{observability.AttrSource: "publisher"}))
	assert.EqualValues(t, 4, sum(t, ms, observability.MetricFetchEvents, map[string]any{observability.AttrSource: "reader"}))
	assert.EqualValues(t, 1, histCount(t, ms, observability.MetricFetchDuration, map[string]any{observability.AttrSource: "publisher", observability.AttrOutcome: "error"}))
	assert.EqualValues(t, 2, histCount(t, ms, observability.MetricFetchDuration, map[string]any{observability.AttrOutcome: "ok"}))
}

func TestOverflow(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.tel.Overflow(ctx, observability.OverflowInfo{Subscription: "orders", Bucket: 1, Policy: observability.PolicyPauseAndResume, Depth: 8, Capacity: 8, Dropped: 8})
	h.tel.Overflow(ctx, observability.OverflowInfo{Subscription: "orders", Bucket: 2, Policy: observability.PolicyPauseAndResume, Depth: 8, Capacity: 8, Dropped: 3})
	h.tel.Overflow(ctx, observability.OverflowInfo{Subscription: "orders", Bucket: 2, Policy: observability.PolicyDropOldest, Depth: 8, Capacity: 8, Dropped: 1})
	h.tel.Overflow(ctx, observability.OverflowInfo{Subscription: "audit", Bucket: 0, Policy: observability.PolicyDropSubscription, Depth: 8, Capacity: 8})

	spans := h.ended(observability.SpanOverflow)
	require.Len(t, spans, 4, "no span in ctx: a short span each")
	a := attrs(spans[2])
	assert.Equal(t, "drop_oldest", a[observability.AttrPolicy])
	assert.EqualValues(t, 8, a[observability.AttrDepth])
	assert.EqualValues(t, 8, a[observability.AttrCapacity])
	assert.EqualValues(t, 1, a[observability.AttrDropped])

	ms := h.collect(t)
	pause := map[string]any{observability.AttrSubscription: "orders", observability.AttrPolicy: "pause_and_resume"}
	assert.EqualValues(t, 2, sum(t, ms, observability.MetricQueueOverflows, pause))
	assert.EqualValues(t, 11, sum(t, ms, observability.MetricQueueDropped, pause))
	assert.EqualValues(t, 1, sum(t, ms, observability.MetricQueueOverflows, map[string]any{observability.AttrPolicy: "drop_oldest"}))
	assert.EqualValues(t, 1, sum(t, ms, observability.MetricQueueOverflows, map[string]any{observability.AttrSubscription: "audit"}))
	assert.EqualValues(t, 0, sum(t, ms, observability.MetricQueueDropped, map[string]any{observability.AttrSubscription: "audit"}))

	logs := h.logs.String()
	assert.Contains(t, logs, `level=DEBUG msg="kumi: reader queue overflow" subscription=orders generation=0 bucket=1 policy=pause_and_resume`)
	assert.Contains(t, logs, `level=WARN msg="kumi: reader queue overflow" subscription=orders generation=0 bucket=2 policy=drop_oldest`)
}

// Batches dropped without an overflow (DropOldest's evictions, refusals
// while paused) count in kumi.queue.dropped alone: no overflow, no span, no
// log line, and no allocation once the subscription and policy are known.
func TestQueueDropped(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.tel.QueueDropped(ctx, "orders", observability.PolicyDropOldest, 1)
	h.tel.QueueDropped(ctx, "orders", observability.PolicyDropOldest, 2)
	h.tel.QueueDropped(ctx, "orders", observability.PolicyPauseAndResume, 0)
	allocs := testing.AllocsPerRun(100, func() { h.tel.QueueDropped(ctx, "orders", observability.PolicyDropOldest, 1) })
	assert.Zero(t, allocs, "allocations per eviction")
	var nilTel *observability.Telemetry
	nilTel.QueueDropped(ctx, "orders", observability.PolicyDropOldest, 1)

	ms := h.collect(t)
	oldest := map[string]any{observability.AttrSubscription: "orders", observability.AttrPolicy: "drop_oldest"}
	assert.EqualValues(t, 3+100+1, sum(t, ms, observability.MetricQueueDropped, oldest), "AllocsPerRun runs once more than asked")
	assert.EqualValues(t, 0, sum(t, ms, observability.MetricQueueDropped, map[string]any{observability.AttrPolicy: "pause_and_resume"}))
	assert.EqualValues(t, 0, sum(t, ms, observability.MetricQueueOverflows, nil))
	assert.Empty(t, h.ended(observability.SpanOverflow))
	assert.NotContains(t, h.logs.String(), "overflow")
}

func TestSupervisionDecision(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	info := observability.SupervisionInfo{
		Actor: "reader", Child: "nonhost/$1/reader-3", Subscription: "orders", Strategy: "one_for_one",
		Directive: observability.DirectiveRestart, Reason: errors.New("connection refused"), Restarts: 2, Backoff: 250 * time.Millisecond,
	}
	h.tel.SupervisionDecision(ctx, info)
	h.tel.SupervisionDecision(ctx, info)
	info.Directive, info.Reason = observability.DirectiveStop, errors.New("fence lost")
	h.tel.SupervisionDecision(ctx, info)
	// Inside a span: an event on it.
	sctx, span := h.tp.Tracer("t").Start(ctx, "outer")
	info.Directive = observability.DirectiveEscalate
	h.tel.SupervisionDecision(sctx, info)
	span.End()

	spans := h.ended(observability.SpanSupervision)
	require.Len(t, spans, 3)
	a := attrs(spans[0])
	assert.Equal(t, "reader", a[observability.AttrActor])
	assert.Equal(t, "restart", a[observability.AttrDirective])
	assert.Equal(t, "nonhost/$1/reader-3", a[observability.AttrChild])
	assert.Equal(t, "one_for_one", a[observability.AttrStrategy])
	assert.EqualValues(t, 2, a[observability.AttrRestarts])
	assert.InDelta(t, 0.25, a[observability.AttrBackoff], 1e-9)
	assert.Equal(t, "connection refused", a[observability.AttrReason])
	require.Len(t, spans[0].Events, 1)
	assert.Equal(t, observability.EventSupervision, spans[0].Events[0].Name)
	outer := h.ended("outer")
	require.Len(t, outer, 1)
	require.Len(t, outer[0].Events, 1)
	assert.Equal(t, observability.EventSupervision, outer[0].Events[0].Name)

	ms := h.collect(t)
	assert.EqualValues(t, 2, sum(t, ms, observability.MetricSupervisionRestarts, map[string]any{observability.AttrActor: "reader"}))
	assert.EqualValues(t, 2, sum(t, ms, observability.MetricSupervisionDecision, map[string]any{observability.AttrDirective: "restart"}))
	assert.EqualValues(t, 1, sum(t, ms, observability.MetricSupervisionDecision, map[string]any{observability.AttrDirective: "stop"}))
	assert.EqualValues(t, 1, sum(t, ms, observability.MetricSupervisionDecision, map[string]any{observability.AttrDirective: "escalate"}))

	logs := h.logs.String()
	assert.Contains(t, logs, `level=WARN msg="kumi: supervision decision" actor=reader directive=restart`)
	assert.Contains(t, logs, `level=INFO msg="kumi: supervision decision" actor=reader directive=stop`)
	assert.Contains(t, logs, `level=ERROR msg="kumi: supervision decision" actor=reader directive=escalate`)
}

func TestNotifierReconnect(t *testing.T) {
	h := newHarness(t)
	ctx, span := h.tp.Tracer("t").Start(context.Background(), "notifier")
	h.tel.NotifierReconnect(ctx, 1, errors.New("EOF"))
	h.tel.NotifierReconnect(ctx, 2, errors.New("connection refused"))
	span.End()
	ms := h.collect(t)
	assert.EqualValues(t, 2, sum(t, ms, observability.MetricNotifierReconnects, nil))
	require.Len(t, h.ended("notifier")[0].Events, 2)
	assert.Contains(t, h.logs.String(), `level=WARN msg="kumi: notifier reconnecting" attempt=2 err="connection refused"`)
}

// TestStatusGauges: registered status sources feed the gauges and Status;
// unregistering removes them.
func TestStatusGauges(t *testing.T) {
	h := newHarness(t)
	var lag atomic.Int64
	lag.Store(5)
	unregister := h.tel.RegisterStatus(func() observability.SubscriptionStatus {
		return observability.SubscriptionStatus{
			Subscription: "orders", Worker: "w1", Buckets: 4, LiveWorkers: 2,
			Owned: []observability.BucketStatus{
				{Bucket: 3, Epoch: 9, State: "live", Checkpoint: 120, LagEvents: lag.Load(), LagSeconds: 1.5, QueueDepth: 2, QueueBytes: 4096},
				{Bucket: 1, Epoch: 4, State: "catching_up", Checkpoint: 80},
			},
		}
	})
	unregisterAudit := h.tel.RegisterStatus(func() observability.SubscriptionStatus {
		return observability.SubscriptionStatus{Subscription: "audit", Worker: "w1", Buckets: 2}
	})
	defer unregisterAudit()

	st := h.tel.Status()
	require.Len(t, st, 2)
	assert.Equal(t, "audit", st[0].Subscription)
	assert.NotNil(t, st[0].Owned)
	assert.Equal(t, []int{1, 3}, []int{st[1].Owned[0].Bucket, st[1].Owned[1].Bucket}, "sorted by bucket")

	ms := h.collect(t)
	assert.EqualValues(t, 2, sum(t, ms, observability.MetricBucketsOwned, map[string]any{observability.AttrSubscription: "orders", observability.AttrWorker: "w1"}))
	assert.EqualValues(t, 0, sum(t, ms, observability.MetricBucketsOwned, map[string]any{observability.AttrSubscription: "audit"}))
	_, hasAudit := gaugeValue(ms, observability.MetricBucketsOwned, map[string]any{observability.AttrSubscription: "audit"})
	assert.True(t, hasAudit, "a subscription owning nothing reports 0")
	b3 := map[string]any{observability.AttrSubscription: "orders", observability.AttrBucket: int64(3)}
	assert.EqualValues(t, 5, sum(t, ms, observability.MetricLagEvents, b3))
	assert.EqualValues(t, 2, sum(t, ms, observability.MetricQueueDepth, b3))
	assert.EqualValues(t, 4096, sum(t, ms, observability.MetricQueueBytes, b3))
	secs := ms[observability.MetricLagSeconds].Data.(metricdata.Gauge[float64])
	found := false
	for _, p := range secs.DataPoints {
		if matches(p.Attributes, b3) {
			found = true
			assert.InDelta(t, 1.5, p.Value, 1e-9)
		}
	}
	assert.True(t, found)

	lag.Store(0)
	ms = h.collect(t)
	assert.EqualValues(t, 0, sum(t, ms, observability.MetricLagEvents, b3))

	unregister()
	ms = h.collect(t)
	_, hasOrders := gaugeValue(ms, observability.MetricBucketsOwned, map[string]any{observability.AttrSubscription: "orders"})
	assert.False(t, hasOrders, "unregistered: gone")
	assert.Len(t, h.tel.Status(), 1)
}

func gaugeValue(ms map[string]metricdata.Metrics, name string, want map[string]any) (int64, bool) {
	m, ok := ms[name]
	if !ok {
		return 0, false
	}
	for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		if matches(p.Attributes, want) {
			return p.Value, true
		}
	}
	return 0, false
}
