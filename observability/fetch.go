package observability

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kumi-run/kumi/internal/obsname"
)

// FetchSpan is an open read of events from the store; end it with End. The
// zero value is a no-op.
type FetchSpan struct {
	t      *Telemetry
	span   trace.Span
	start  time.Time
	source string
}

// StartPublisherFetch opens a kumi.publisher.fetch span for one read of new
// events by the publisher (after a notification or a safety poll), reading
// after position from, for subscribers subscribed queues. Pass the
// returned context to Overflow calls made while fanning the batch out.
func (t *Telemetry) StartPublisherFetch(ctx context.Context, from int64, subscribers int) (context.Context, FetchSpan) {
	if t == nil {
		return ctx, FetchSpan{}
	}
	ctx, span := t.tracer.Start(ctx, obsname.SpanPublisherFetch, consumerSpan...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String(obsname.AttrMessagingSystem, obsname.MessagingSystem),
			attribute.String(obsname.AttrMessagingOperationType, "receive"),
			attribute.String(obsname.AttrMessagingOperationName, "fetch"),
			attribute.String(obsname.AttrSource, obsname.SourcePublisher),
			attribute.Int64(obsname.AttrFrom, from),
			attribute.Int(obsname.AttrSubscribers, subscribers),
		)
	}
	return ctx, FetchSpan{t: t, span: span, start: time.Now(), source: obsname.SourcePublisher}
}

// StartReaderFetch opens a kumi.reader.fetch span for one catch-up read of
// a bucket by its reader, reading after position from.
func (t *Telemetry) StartReaderFetch(ctx context.Context, subscription string, bucket int, from int64) (context.Context, FetchSpan) {
	if t == nil {
		return ctx, FetchSpan{}
	}
	ctx, span := t.tracer.Start(ctx, obsname.SpanReaderFetch, consumerSpan...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String(obsname.AttrMessagingSystem, obsname.MessagingSystem),
			attribute.String(obsname.AttrMessagingOperationType, "receive"),
			attribute.String(obsname.AttrMessagingOperationName, "fetch"),
			attribute.String(obsname.AttrMessagingConsumerGroup, subscription),
			attribute.String(obsname.AttrSource, obsname.SourceReader),
			attribute.String(obsname.AttrSubscription, subscription),
			attribute.Int64(obsname.AttrFrom, from),
		)
		span.SetAttributes(bucketAttrs(bucket)...)
	}
	return ctx, FetchSpan{t: t, span: span, start: time.Now(), source: obsname.SourceReader}
}

// End closes the fetch: events read, the last position read (ignored when
// events is 0) and the error, if any. It records kumi.fetch.duration and
// adds events to kumi.fetch.events.
func (f FetchSpan) End(events int, last int64, err error) {
	if f.t == nil {
		return
	}
	if f.span.IsRecording() {
		f.span.SetAttributes(
			attribute.Int(obsname.AttrCount, events),
			attribute.Int(obsname.AttrMessagingBatchCount, events))
		if events > 0 {
			f.span.SetAttributes(attribute.Int64(obsname.AttrLast, last))
		}
		if err != nil {
			f.span.RecordError(err)
			f.span.SetStatus(codes.Error, err.Error())
		}
	}
	f.span.End()
	ctx := context.Background()
	t := f.t
	t.inst.fetchDur.Record(ctx, time.Since(f.start).Seconds(),
		t.measure(measureKey{kind: measureFetch, sub: f.source, s: outcomeOf(err)}).rec...)
	if events > 0 {
		t.inst.fetchEvents.Add(ctx, int64(events), t.measure(measureKey{kind: measureFetchCount, sub: f.source}).add...)
	}
}
