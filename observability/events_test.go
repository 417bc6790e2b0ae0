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

	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

func TestFetchSpans(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	fctx, f := h.tel.StartPublisherFetch(ctx, 100, 3)
	h.tel.Overflow(fctx, observability.OverflowInfo{Subscription: "orders", Bucket: 1, Policy: obsname.PolicyPauseAndResume, Depth: 64, Capacity: 64, Dropped: 64})
	f.End(10, 110, nil)
	_, f = h.tel.StartPublisherFetch(ctx, 110, 3)
	f.End(0, 0, errors.New("conn reset"))
	_, f = h.tel.StartReaderFetch(ctx, "orders", 2, 50)
	f.End(4, 57, nil)

	pub := h.ended(obsname.SpanPublisherFetch)
	require.Len(t, pub, 2)
	a := attrs(pub[0])
	assert.EqualValues(t, 100, a[obsname.AttrFrom])
	assert.EqualValues(t, 110, a[obsname.AttrLast])
	assert.EqualValues(t, 10, a[obsname.AttrCount])
	assert.EqualValues(t, 10, a[obsname.AttrMessagingBatchCount])
	assert.EqualValues(t, 3, a[obsname.AttrSubscribers])
	assert.Equal(t, "receive", a[obsname.AttrMessagingOperationType])
	assert.Equal(t, trace.SpanKindConsumer, pub[0].SpanKind)
	require.Len(t, pub[0].Events, 1, "the overflow is an event of the fetch that caused it")
	assert.Equal(t, obsname.EventOverflow, pub[0].Events[0].Name)
	assert.NotContains(t, attrs(pub[1]), obsname.AttrLast)
	assert.Equal(t, codes.Error, pub[1].Status.Code)
	assert.Empty(t, h.ended(obsname.SpanOverflow))

	rd := h.ended(obsname.SpanReaderFetch)
	require.Len(t, rd, 1)
	a = attrs(rd[0])
	assert.Equal(t, "orders", a[obsname.AttrSubscription])
	assert.EqualValues(t, 2, a[obsname.AttrBucket])
	assert.Equal(t, "reader", a[obsname.AttrSource])

	ms := h.collect(t)
	assert.EqualValues(t, 10, sum(t, ms, obsname.MetricFetchEvents, map[string]any{obsname.AttrSource: "publisher"}))
	assert.EqualValues(t, 4, sum(t, ms, obsname.MetricFetchEvents, map[string]any{obsname.AttrSource: "reader"}))
	assert.EqualValues(t, 1, histCount(t, ms, obsname.MetricFetchDuration, map[string]any{obsname.AttrSource: "publisher", obsname.AttrOutcome: "error"}))
	assert.EqualValues(t, 2, histCount(t, ms, obsname.MetricFetchDuration, map[string]any{obsname.AttrOutcome: "ok"}))
}

func TestOverflow(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.tel.Overflow(ctx, observability.OverflowInfo{Subscription: "orders", Bucket: 1, Policy: obsname.PolicyPauseAndResume, Depth: 8, Capacity: 8, Dropped: 8})
	h.tel.Overflow(ctx, observability.OverflowInfo{Subscription: "orders", Bucket: 2, Policy: obsname.PolicyPauseAndResume, Depth: 8, Capacity: 8, Dropped: 3})
	h.tel.Overflow(ctx, observability.OverflowInfo{Subscription: "orders", Bucket: 2, Policy: obsname.PolicyDropOldest, Depth: 8, Capacity: 8, Dropped: 1})
	h.tel.Overflow(ctx, observability.OverflowInfo{Subscription: "audit", Bucket: 0, Policy: obsname.PolicyDropSubscription, Depth: 8, Capacity: 8})

	spans := h.ended(obsname.SpanOverflow)
	require.Len(t, spans, 4, "no span in ctx: a short span each")
	a := attrs(spans[2])
	assert.Equal(t, "drop_oldest", a[obsname.AttrPolicy])
	assert.EqualValues(t, 8, a[obsname.AttrDepth])
	assert.EqualValues(t, 8, a[obsname.AttrCapacity])
	assert.EqualValues(t, 1, a[obsname.AttrDropped])

	ms := h.collect(t)
	pause := map[string]any{obsname.AttrSubscription: "orders", obsname.AttrPolicy: "pause_and_resume"}
	assert.EqualValues(t, 2, sum(t, ms, obsname.MetricQueueOverflows, pause))
	assert.EqualValues(t, 11, sum(t, ms, obsname.MetricQueueDropped, pause))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricQueueOverflows, map[string]any{obsname.AttrPolicy: "drop_oldest"}))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricQueueOverflows, map[string]any{obsname.AttrSubscription: "audit"}))
	assert.EqualValues(t, 0, sum(t, ms, obsname.MetricQueueDropped, map[string]any{obsname.AttrSubscription: "audit"}))

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
	h.tel.QueueDropped(ctx, "orders", obsname.PolicyDropOldest, 1)
	h.tel.QueueDropped(ctx, "orders", obsname.PolicyDropOldest, 2)
	h.tel.QueueDropped(ctx, "orders", obsname.PolicyPauseAndResume, 0)
	allocs := testing.AllocsPerRun(100, func() { h.tel.QueueDropped(ctx, "orders", obsname.PolicyDropOldest, 1) })
	assert.Zero(t, allocs, "allocations per eviction")
	var nilTel *observability.Telemetry
	nilTel.QueueDropped(ctx, "orders", obsname.PolicyDropOldest, 1)

	ms := h.collect(t)
	oldest := map[string]any{obsname.AttrSubscription: "orders", obsname.AttrPolicy: "drop_oldest"}
	assert.EqualValues(t, 3+100+1, sum(t, ms, obsname.MetricQueueDropped, oldest), "AllocsPerRun runs once more than asked")
	assert.EqualValues(t, 0, sum(t, ms, obsname.MetricQueueDropped, map[string]any{obsname.AttrPolicy: "pause_and_resume"}))
	assert.EqualValues(t, 0, sum(t, ms, obsname.MetricQueueOverflows, nil))
	assert.Empty(t, h.ended(obsname.SpanOverflow))
	assert.NotContains(t, h.logs.String(), "overflow")
}

func TestSupervisionDecision(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	info := observability.SupervisionInfo{
		Actor: "reader", Child: "nonhost/$1/reader-3", Subscription: "orders", Strategy: "one_for_one",
		Directive: obsname.DirectiveRestart, Reason: errors.New("connection refused"), Restarts: 2, Backoff: 250 * time.Millisecond,
	}
	h.tel.SupervisionDecision(ctx, info)
	h.tel.SupervisionDecision(ctx, info)
	info.Directive, info.Reason = obsname.DirectiveStop, errors.New("fence lost")
	h.tel.SupervisionDecision(ctx, info)
	// Inside a span: an event on it.
	sctx, span := h.tp.Tracer("t").Start(ctx, "outer")
	info.Directive = obsname.DirectiveEscalate
	h.tel.SupervisionDecision(sctx, info)
	span.End()

	spans := h.ended(obsname.SpanSupervision)
	require.Len(t, spans, 3)
	a := attrs(spans[0])
	assert.Equal(t, "reader", a[obsname.AttrActor])
	assert.Equal(t, "restart", a[obsname.AttrDirective])
	assert.Equal(t, "nonhost/$1/reader-3", a[obsname.AttrChild])
	assert.Equal(t, "one_for_one", a[obsname.AttrStrategy])
	assert.EqualValues(t, 2, a[obsname.AttrRestarts])
	assert.InDelta(t, 0.25, a[obsname.AttrBackoff], 1e-9)
	assert.Equal(t, "connection refused", a[obsname.AttrReason])
	require.Len(t, spans[0].Events, 1)
	assert.Equal(t, obsname.EventSupervision, spans[0].Events[0].Name)
	outer := h.ended("outer")
	require.Len(t, outer, 1)
	require.Len(t, outer[0].Events, 1)
	assert.Equal(t, obsname.EventSupervision, outer[0].Events[0].Name)

	ms := h.collect(t)
	assert.EqualValues(t, 2, sum(t, ms, obsname.MetricSupervisionRestarts, map[string]any{obsname.AttrActor: "reader"}))
	assert.EqualValues(t, 2, sum(t, ms, obsname.MetricSupervisionDecision, map[string]any{obsname.AttrDirective: "restart"}))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricSupervisionDecision, map[string]any{obsname.AttrDirective: "stop"}))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricSupervisionDecision, map[string]any{obsname.AttrDirective: "escalate"}))

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
	assert.EqualValues(t, 2, sum(t, ms, obsname.MetricNotifierReconnects, nil))
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
	assert.EqualValues(t, 2, sum(t, ms, obsname.MetricBucketsOwned, map[string]any{obsname.AttrSubscription: "orders", obsname.AttrWorker: "w1"}))
	assert.EqualValues(t, 0, sum(t, ms, obsname.MetricBucketsOwned, map[string]any{obsname.AttrSubscription: "audit"}))
	_, hasAudit := gaugeValue(ms, obsname.MetricBucketsOwned, map[string]any{obsname.AttrSubscription: "audit"})
	assert.True(t, hasAudit, "a subscription owning nothing reports 0")
	b3 := map[string]any{obsname.AttrSubscription: "orders", obsname.AttrBucket: int64(3)}
	assert.EqualValues(t, 5, sum(t, ms, obsname.MetricLagEvents, b3))
	assert.EqualValues(t, 2, sum(t, ms, obsname.MetricQueueDepth, b3))
	assert.EqualValues(t, 4096, sum(t, ms, obsname.MetricQueueBytes, b3))
	secs := ms[obsname.MetricLagSeconds].Data.(metricdata.Gauge[float64])
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
	assert.EqualValues(t, 0, sum(t, ms, obsname.MetricLagEvents, b3))

	unregister()
	ms = h.collect(t)
	_, hasOrders := gaugeValue(ms, obsname.MetricBucketsOwned, map[string]any{obsname.AttrSubscription: "orders"})
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
