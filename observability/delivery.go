package observability

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/kumi-run/kumi/internal/obsname"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// DeliveryInfo describes one delivery of one event to the handler.
type DeliveryInfo struct {
	// Subscription and Bucket say which reader delivers (Bucket is the
	// store's slot, carried split as kumi.generation and kumi.bucket, as
	// in OwnershipChange); Worker is this worker's id.
	Subscription string
	Bucket       int
	Worker       string
	// The event: its category, stream, id, type, version and global
	// position. Ids go on the span only, never on metrics.
	Category string
	Stream   string
	EventID  string
	// EventUUID stands for EventID when that is empty; it is formatted only
	// for a recording span (formatting a UUID on every delivery costs).
	EventUUID uuid.UUID
	EventType string
	Version   int64
	Position  int64
	// Attempt counts deliveries of this event, from 1.
	Attempt int
}

// DeliverySpan is an open delivery; end it with End or EndPanic exactly
// once. The zero value is a no-op.
type DeliverySpan struct {
	t     *Telemetry
	span  trace.Span
	start time.Time
	sub   string
	bkt   int
}

// StartDelivery opens a kumi.deliver span (kind consumer) as a child of
// ctx's span and counts the delivery in kumi.events.delivered.
//
// The runtime restores the appender's trace context first, so that the
// delivery joins the trace that appended the event:
//
//	ctx := eventsource.TraceContext(readerCtx, ev.Metadata)
//	ctx, d := tel.StartDelivery(ctx, observability.DeliveryInfo{…})
//	// deliver ctx (or d.SpanContext()) to the handler, await its reply
//	d.End(observability.OutcomeAck, nil)
//
// An event appended without a span starts a new trace. While no tracer
// provider is in use — New took otel's global one, and nothing has set it
// since — no span is started and ctx is returned as it is: such a span
// would record nothing, and starting it costs every delivery.
func (t *Telemetry) StartDelivery(ctx context.Context, info DeliveryInfo) (context.Context, DeliverySpan) {
	if t == nil {
		return ctx, DeliverySpan{}
	}
	var span trace.Span
	if t.tracing() {
		ctx, span = t.tracer.Start(ctx, obsname.SpanDeliver, consumerSpan...)
	}
	if span != nil && span.IsRecording() {
		if info.EventID == "" && info.EventUUID != uuid.Nil {
			info.EventID = info.EventUUID.String()
		}
		span.SetAttributes(
			attribute.String(obsname.AttrMessagingSystem, obsname.MessagingSystem),
			attribute.String(obsname.AttrMessagingOperationType, "process"),
			attribute.String(obsname.AttrMessagingOperationName, "deliver"),
			attribute.String(obsname.AttrMessagingDestination, info.Category),
			attribute.String(obsname.AttrMessagingConsumerGroup, info.Subscription),
			attribute.String(obsname.AttrMessagingMessageID, info.EventID),
			attribute.String(obsname.AttrSubscription, info.Subscription),
			attribute.String(obsname.AttrWorker, info.Worker),
			attribute.String(obsname.AttrStream, info.Stream),
			attribute.String(obsname.AttrEventType, info.EventType),
			attribute.Int64(obsname.AttrEventVersion, info.Version),
			attribute.Int64(obsname.AttrPosition, info.Position),
			attribute.Int(obsname.AttrAttempt, info.Attempt),
		)
		span.SetAttributes(bucketAttrs(info.Bucket)...)
	}
	t.inst.delivered.Add(ctx, 1, t.measure(measureKey{kind: measureBucket, sub: info.Subscription, bucket: info.Bucket}).add...)
	return ctx, DeliverySpan{t: t, span: span, start: time.Now(), sub: info.Subscription, bkt: info.Bucket}
}

// SpanContext returns the delivery span's context, for a runtime that
// carries it in a message instead of a context.Context.
func (d DeliverySpan) SpanContext() trace.SpanContext {
	if d.span == nil {
		return trace.SpanContext{}
	}
	return d.span.SpanContext()
}

// End closes the delivery with the handler's outcome. err is the handler's
// error for a retry, the dead-letter reason for a dead letter, nil for an
// ack. It records kumi.handler.duration and the outcome's counter
// (kumi.events.acked, .retried — for retry, panic and timeout — or
// .dead_lettered); a dead letter adds a kumi.dead_letter event. Any outcome
// but ack and cancelled sets the span's status to Error.
func (d DeliverySpan) End(outcome Outcome, err error) { d.end(outcome, err, false) }

func (d DeliverySpan) end(outcome Outcome, err error, recorded bool) {
	if d.t == nil {
		return
	}
	if d.span != nil && d.span.IsRecording() {
		d.span.SetAttributes(attribute.String(obsname.AttrOutcome, string(outcome)))
		switch outcome {
		case OutcomeAck, OutcomeCancelled:
		case OutcomeDeadLetter:
			reason := "dead letter"
			if err != nil {
				reason = err.Error()
			}
			d.span.AddEvent(obsname.EventDeadLetter, trace.WithAttributes(attribute.String(obsname.AttrReason, reason)))
			d.span.SetStatus(codes.Error, reason)
		default:
			if err != nil {
				if !recorded {
					d.span.RecordError(err)
				}
				d.span.SetStatus(codes.Error, err.Error())
			} else {
				d.span.SetStatus(codes.Error, string(outcome))
			}
		}
	}
	if d.span != nil {
		d.span.End()
	}

	ctx := context.Background()
	t := d.t
	t.inst.handlerDur.Record(ctx, time.Since(d.start).Seconds(),
		t.measure(measureKey{kind: measureHandler, sub: d.sub, s: string(outcome)}).rec...)
	switch outcome {
	case OutcomeAck:
		t.inst.acked.Add(ctx, 1, t.measure(measureKey{kind: measureBucket, sub: d.sub, bucket: d.bkt}).add...)
	case OutcomeDeadLetter:
		t.inst.deadLettered.Add(ctx, 1, t.measure(measureKey{kind: measureBucket, sub: d.sub, bucket: d.bkt}).add...)
	case OutcomeRetry, OutcomePanic, OutcomeTimeout:
		t.inst.retried.Add(ctx, 1, t.measure(measureKey{kind: measureRetry, sub: d.sub, bucket: d.bkt, s: string(outcome)}).add...)
	}
}

// EndPanic closes the delivery of a handler that panicked with recovered:
// the span gets an exception event with the stack, and the delivery counts
// as a retry with outcome panic.
func (d DeliverySpan) EndPanic(recovered any, stack []byte) {
	if d.t == nil {
		return
	}
	err := fmt.Errorf("handler panic: %v", recovered)
	if d.span != nil && d.span.IsRecording() {
		d.span.RecordError(err, trace.WithAttributes(
			attribute.String("exception.stacktrace", string(stack)),
			attribute.Bool("exception.escaped", true)))
	}
	d.end(OutcomePanic, err, true)
}
