package observability

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/kumi-run/kumi/internal/obsname"
)

// ParkingInfo describes a subscription parking a stream, or ending a
// parked stream's release (see docs/design/parking.md).
type ParkingInfo struct {
	// Subscription and Bucket say whose reader it is; Bucket is the
	// store's slot, carried split as in OwnershipChange.
	Subscription string
	Bucket       int
	// Stream is the parked stream; Version the event it is parked at, or,
	// released, the last version its release delivered.
	Stream  string
	Version int64
	// Released: the release ended, the stream's events flow again
	// (Action says which: replay or discard). Else the stream was parked,
	// for Reason (the dead letter's).
	Released bool
	Action   string
	Reason   string
}

// Parking records a stream parked or released: a kumi.stream.parked or
// kumi.stream.released event on ctx's span if it is recording, else a
// short kumi.parking span that carries it; a release also counts in
// kumi.parked.releases. Logged at Info.
func (t *Telemetry) Parking(ctx context.Context, p ParkingInfo) {
	if t == nil {
		return
	}
	event, what := obsname.EventStreamParked, "kumi: stream parked"
	if p.Released {
		event, what = obsname.EventStreamReleased, "kumi: parked stream released"
	}
	attrs := []attribute.KeyValue{
		attribute.String(obsname.AttrSubscription, p.Subscription),
		attribute.Int(obsname.AttrGeneration, slotGeneration(p.Bucket)),
		attribute.Int(obsname.AttrBucket, slotBucket(p.Bucket)),
		attribute.String(obsname.AttrStream, p.Stream),
		attribute.Int64(obsname.AttrEventVersion, p.Version),
	}
	if p.Released {
		attrs = append(attrs, attribute.String(obsname.AttrAction, p.Action))
	} else {
		attrs = append(attrs, attribute.String(obsname.AttrReason, p.Reason))
	}
	if span, ok := recording(ctx); ok {
		span.AddEvent(event, trace.WithAttributes(attrs...))
	} else {
		_, span := t.tracer.Start(ctx, obsname.SpanParking, internalSpan...)
		if span.IsRecording() {
			span.SetAttributes(attrs...)
			span.AddEvent(event)
		}
		span.End()
	}
	if p.Released {
		t.inst.parkedReleases.Add(ctx, 1, metric.WithAttributes(
			attribute.String(obsname.AttrSubscription, p.Subscription), attribute.String(obsname.AttrAction, p.Action)))
	}
	if t.logger.Enabled(ctx, slog.LevelInfo) {
		t.logger.LogAttrs(ctx, slog.LevelInfo, what, slog.String("subscription", p.Subscription),
			slog.Int("generation", slotGeneration(p.Bucket)), slog.Int("bucket", slotBucket(p.Bucket)),
			slog.String("stream", p.Stream), slog.Int64("version", p.Version), slog.String("action", p.Action),
			slog.String("reason", p.Reason))
	}
}
