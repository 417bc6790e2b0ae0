package observability_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

// appendMetadata is what the event store writes at append time: the
// appender's W3C trace context in the event's JSON metadata.
func appendMetadata(t *testing.T, ctx context.Context, extra map[string]string) json.RawMessage {
	t.Helper()
	carrier := propagation.MapCarrier{}
	for k, v := range extra {
		carrier[k] = v
	}
	propagation.TraceContext{}.Inject(ctx, carrier)
	b, err := json.Marshal(carrier)
	require.NoError(t, err)
	return b
}

func delivery(bucket int, pos int64, attempt int) observability.DeliveryInfo {
	return observability.DeliveryInfo{
		Subscription: "orders", Bucket: bucket, Worker: "w1", Category: "order", Stream: "order-7",
		EventID: "0190f2e4-6c1a-7d3e-9b2a-3f4e5d6c7b8a", EventType: "Placed", Version: 2, Position: pos, Attempt: attempt,
	}
}

// TestDeliveryJoinsAppenderTrace: the appender's span context, stored in
// metadata and restored with eventsource.TraceContext, is the delivery
// span's parent.
func TestDeliveryJoinsAppenderTrace(t *testing.T) {
	h := newHarness(t)
	actx, appendSpan := h.tp.Tracer("app").Start(context.Background(), "place order")
	md := appendMetadata(t, actx, map[string]string{"correlation": "c-1"})
	appendSpan.End()

	// Later, in another process: the reader restores the context.
	ctx := eventsource.TraceContext(context.Background(), md)
	dctx, d := h.tel.StartDelivery(ctx, delivery(3, 42, 1))
	assert.Equal(t, trace.SpanContextFromContext(dctx), d.SpanContext())
	_, handlerSpan := h.tp.Tracer("handler").Start(dctx, "project order")
	handlerSpan.End()
	d.End(observability.OutcomeAck, nil)

	app := h.ended("place order")
	del := h.ended(obsname.SpanDeliver)
	hs := h.ended("project order")
	require.Len(t, app, 1)
	require.Len(t, del, 1)
	require.Len(t, hs, 1)
	assert.Equal(t, app[0].SpanContext.TraceID(), del[0].SpanContext.TraceID(), "same trace as the append")
	assert.Equal(t, app[0].SpanContext.SpanID(), del[0].Parent.SpanID(), "child of the append span")
	assert.True(t, del[0].Parent.IsRemote())
	assert.Equal(t, del[0].SpanContext.SpanID(), hs[0].Parent.SpanID(), "the handler's spans nest under the delivery")
	assert.Equal(t, trace.SpanKindConsumer, del[0].SpanKind)

	a := attrs(del[0])
	assert.Equal(t, "orders", a[obsname.AttrSubscription])
	assert.EqualValues(t, 3, a[obsname.AttrBucket])
	assert.EqualValues(t, 42, a[obsname.AttrPosition])
	assert.EqualValues(t, 1, a[obsname.AttrAttempt])
	assert.Equal(t, "ack", a[obsname.AttrOutcome])
	assert.Equal(t, "order-7", a[obsname.AttrStream])
	assert.Equal(t, "Placed", a[obsname.AttrEventType])
	assert.EqualValues(t, 2, a[obsname.AttrEventVersion])
	assert.Equal(t, "w1", a[obsname.AttrWorker])
	assert.Equal(t, "kumi", a[obsname.AttrMessagingSystem])
	assert.Equal(t, "process", a[obsname.AttrMessagingOperationType])
	assert.Equal(t, "order", a[obsname.AttrMessagingDestination])
	assert.Equal(t, "orders", a[obsname.AttrMessagingConsumerGroup])
	assert.Equal(t, "0190f2e4-6c1a-7d3e-9b2a-3f4e5d6c7b8a", a[obsname.AttrMessagingMessageID])
	assert.Equal(t, codes.Unset, del[0].Status.Code)
}

func TestDeliveryWithoutTraceContextIsRoot(t *testing.T) {
	h := newHarness(t)
	ctx := eventsource.TraceContext(context.Background(), json.RawMessage(`{"correlation":"c-1"}`))
	_, d := h.tel.StartDelivery(ctx, delivery(0, 1, 1))
	d.End(observability.OutcomeAck, nil)
	del := h.ended(obsname.SpanDeliver)
	require.Len(t, del, 1)
	assert.False(t, del[0].Parent.IsValid())
}

func TestDeliveryOutcomes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	end := func(bucket int, o observability.Outcome, err error) {
		_, d := h.tel.StartDelivery(ctx, delivery(bucket, 1, 1))
		d.End(o, err)
	}
	end(1, observability.OutcomeAck, nil)
	end(1, observability.OutcomeAck, nil)
	end(1, observability.OutcomeAck, nil)
	end(1, observability.OutcomeRetry, errors.New("try later"))
	end(2, observability.OutcomeTimeout, nil)
	end(2, observability.OutcomeDeadLetter, errors.New("poison"))
	end(2, observability.OutcomeCancelled, nil)
	func() {
		_, d := h.tel.StartDelivery(ctx, delivery(2, 1, 1))
		defer func() {
			if r := recover(); r != nil {
				d.EndPanic(r, []byte("goroutine 1 [running]:\nmain.handler()"))
			}
		}()
		panic("boom")
	}()

	ms := h.collect(t)
	b := func(bucket int) map[string]any {
		return map[string]any{obsname.AttrSubscription: "orders", obsname.AttrBucket: int64(bucket)}
	}
	assert.EqualValues(t, 4, sum(t, ms, obsname.MetricEventsDelivered, b(1)))
	assert.EqualValues(t, 4, sum(t, ms, obsname.MetricEventsDelivered, b(2)))
	assert.EqualValues(t, 3, sum(t, ms, obsname.MetricEventsAcked, b(1)))
	assert.EqualValues(t, 0, sum(t, ms, obsname.MetricEventsAcked, b(2)))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricEventsRetried, b(1)))
	assert.EqualValues(t, 2, sum(t, ms, obsname.MetricEventsRetried, b(2)))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricEventsRetried, map[string]any{obsname.AttrOutcome: "panic"}))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricEventsRetried, map[string]any{obsname.AttrOutcome: "timeout"}))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricEventsDeadLettered, b(2)))
	assert.EqualValues(t, 8, histCount(t, ms, obsname.MetricHandlerDuration, map[string]any{obsname.AttrSubscription: "orders"}))
	assert.EqualValues(t, 3, histCount(t, ms, obsname.MetricHandlerDuration, map[string]any{obsname.AttrOutcome: "ack"}))
	// The histogram has no bucket attribute (cardinality).
	for _, p := range ms[obsname.MetricHandlerDuration].Data.(metricdata.Histogram[float64]).DataPoints {
		assert.False(t, p.Attributes.HasValue(obsname.AttrBucket))
	}

	byOutcome := map[string]int{}
	for _, s := range h.ended(obsname.SpanDeliver) {
		o := attrs(s)[obsname.AttrOutcome].(string)
		byOutcome[o]++
		switch o {
		case "ack", "cancelled":
			assert.Equal(t, codes.Unset, s.Status.Code, o)
		case "dead_letter":
			assert.Equal(t, codes.Error, s.Status.Code)
			require.Len(t, s.Events, 1)
			assert.Equal(t, obsname.EventDeadLetter, s.Events[0].Name)
			assert.Equal(t, "poison", s.Events[0].Attributes[0].Value.AsString())
		case "panic":
			assert.Equal(t, codes.Error, s.Status.Code)
			require.Len(t, s.Events, 1, "one exception event")
			ev := map[string]any{}
			for _, kv := range s.Events[0].Attributes {
				ev[string(kv.Key)] = kv.Value.AsInterface()
			}
			assert.Equal(t, "exception", s.Events[0].Name)
			assert.Equal(t, "handler panic: boom", ev["exception.message"])
			assert.Contains(t, ev["exception.stacktrace"], "main.handler()")
		default:
			assert.Equal(t, codes.Error, s.Status.Code, o)
		}
	}
	assert.Equal(t, map[string]int{"ack": 3, "retry": 1, "timeout": 1, "dead_letter": 1, "cancelled": 1, "panic": 1}, byOutcome)
}

// TestNilAndNoopCostNothing: a nil Telemetry and one over no-op providers
// accept every hook; on the delivery path the no-op one allocates at most
// the context that carries its span.
func TestNilAndNoopCostNothing(t *testing.T) {
	ctx := context.Background()
	var nilTel *observability.Telemetry
	noop := observability.New(observability.Options{
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  metricnoop.NewMeterProvider(),
		Logger:         slog.New(slog.DiscardHandler),
	})
	defer noop.Close()
	for _, tel := range []*observability.Telemetry{nilTel, noop} {
		pctx, p := tel.StartReconcile(ctx, "s", "w")
		tel.OwnershipChange(pctx, observability.OwnershipChange{Kind: observability.ChangeClaim})
		tel.LeaseOperation(pctx, "s", observability.LeaseClaim, time.Now(), errors.New("x"))
		p.End(observability.PassSummary{Claimed: 1})
		_, d := tel.StartDelivery(ctx, delivery(0, 1, 1))
		d.End(observability.OutcomeAck, nil)
		_, d = tel.StartDelivery(ctx, delivery(0, 1, 1))
		d.EndPanic("x", nil)
		fctx, f := tel.StartPublisherFetch(ctx, 0, 1)
		tel.Overflow(fctx, observability.OverflowInfo{Policy: obsname.PolicyDropOldest})
		f.End(1, 1, nil)
		_, f = tel.StartReaderFetch(ctx, "s", 0, 0)
		f.End(0, 0, nil)
		tel.SupervisionDecision(ctx, observability.SupervisionInfo{Directive: obsname.DirectiveRestart})
		tel.NotifierReconnect(ctx, 1, errors.New("x"))
		tel.RegisterStatus(func() observability.SubscriptionStatus { return observability.SubscriptionStatus{} })()
		assert.NotNil(t, tel.Status())
		assert.NotNil(t, tel.Tracer())
		assert.NotNil(t, tel.Meter())
		assert.NotNil(t, tel.Logger())
		assert.NoError(t, tel.Close())
	}
	info := delivery(0, 1, 1)
	allocs := testing.AllocsPerRun(1000, func() {
		_, d := noop.StartDelivery(ctx, info)
		d.End(observability.OutcomeAck, nil)
	})
	assert.LessOrEqual(t, allocs, 1.0)
	allocs = testing.AllocsPerRun(1000, func() {
		_, d := nilTel.StartDelivery(ctx, info)
		d.End(observability.OutcomeAck, nil)
	})
	assert.Zero(t, allocs)
}

func BenchmarkDeliveryNoop(b *testing.B) {
	tel := observability.New(observability.Options{
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  metricnoop.NewMeterProvider(),
	})
	defer tel.Close()
	ctx := context.Background()
	info := delivery(3, 1, 1)
	b.ReportAllocs()
	for b.Loop() {
		_, d := tel.StartDelivery(ctx, info)
		d.End(observability.OutcomeAck, nil)
	}
}
