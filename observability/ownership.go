package observability

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/kumi-run/kumi/internal/obsname"
)

// Span start options, allocated once: they are on the delivery path.
var (
	consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	internalSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
)

var (
	noopTracer    = tracenoop.NewTracerProvider().Tracer(obsname.ScopeName)
	noopMeter     = metricnoop.NewMeterProvider().Meter(obsname.ScopeName)
	discardLogger = slog.New(slog.DiscardHandler)
)

// OwnershipChange describes one change of a bucket's ownership as seen by
// this worker. Subscription, Bucket, Worker and Epoch are always wanted; the
// rest where they apply.
type OwnershipChange struct {
	// Kind is what happened.
	Kind ChangeKind
	// Subscription and Bucket identify the lease. Bucket is the store's
	// slot (generation × 65536 + bucket, as eventsource.Slot makes it);
	// spans, metrics and logs carry it split, as kumi.generation and
	// kumi.bucket.
	Subscription string
	Bucket       int
	// Worker is this worker's id.
	Worker string
	// Epoch is the lease epoch: the one granted for claim, handoff.take and
	// steal; the one held for the others.
	Epoch int64
	// Peer is the other worker, when known: the claimant for shed and
	// handoff.give, the owner for handoff.request, handoff.take and steal.
	Peer string
	// Reason says why, briefly: "over fair share 4", "lease expired",
	// "shutdown", "checkpoint fenced".
	Reason string
	// Evidence is a steal's liveness evidence, e.g. "lease_expired" or
	// "session_gone".
	Evidence string
	// Start is when the operation began (the SQL statement's start); zero
	// means now, for an instant span.
	Start time.Time
	// Err is the error that caused or accompanied the change, if any.
	Err error
}

// OwnershipChange records a span named c.Kind.SpanName() ("kumi.lease.claim",
// …) as a child of ctx's span — pass the reconcile pass's context so the
// pass contains its changes — and counts it in kumi.ownership.changes. It
// logs renew_failed and fence_lost at Warn, steal at Info, the rest at Debug
// (and anything carrying Err at Warn).
//
// Call it once per bucket, after the change took effect in the lease store
// (or, for renew_failed and fence_lost, was detected).
func (t *Telemetry) OwnershipChange(ctx context.Context, c OwnershipChange) {
	if t == nil {
		return
	}
	var opts [2]trace.SpanStartOption
	n := 0
	opts[n] = trace.WithSpanKind(trace.SpanKindInternal)
	n++
	if !c.Start.IsZero() {
		opts[n] = trace.WithTimestamp(c.Start)
		n++
	}
	_, span := t.tracer.Start(ctx, c.Kind.SpanName(), opts[:n]...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String(obsname.AttrChange, string(c.Kind)),
			attribute.String(obsname.AttrSubscription, c.Subscription),
			attribute.String(obsname.AttrWorker, c.Worker),
			attribute.Int64(obsname.AttrEpoch, c.Epoch),
		)
		span.SetAttributes(bucketAttrs(c.Bucket)...)
		if c.Peer != "" {
			span.SetAttributes(attribute.String(obsname.AttrPeer, c.Peer))
		}
		if c.Reason != "" {
			span.SetAttributes(attribute.String(obsname.AttrReason, c.Reason))
		}
		if c.Evidence != "" {
			span.SetAttributes(attribute.String(obsname.AttrEvidence, c.Evidence))
		}
		if c.Err != nil {
			span.RecordError(c.Err)
			span.SetStatus(codes.Error, c.Err.Error())
		}
	}
	span.End()

	t.inst.ownership.Add(ctx, 1, t.measure(measureKey{kind: measureOwnershipKind, sub: c.Subscription, s: string(c.Kind)}).add...)

	level := slog.LevelDebug
	switch {
	case c.Err != nil, c.Kind == ChangeRenewFailed, c.Kind == ChangeFenceLost:
		level = slog.LevelWarn
	case c.Kind == ChangeSteal:
		level = slog.LevelInfo
	}
	if t.logger.Enabled(ctx, level) {
		attrs := []slog.Attr{
			slog.String("change", string(c.Kind)),
			slog.String("subscription", c.Subscription),
			slog.Int("generation", slotGeneration(c.Bucket)),
			slog.Int("bucket", slotBucket(c.Bucket)),
			slog.String("worker", c.Worker),
			slog.Int64("epoch", c.Epoch),
		}
		if c.Peer != "" {
			attrs = append(attrs, slog.String("peer", c.Peer))
		}
		if c.Reason != "" {
			attrs = append(attrs, slog.String("reason", c.Reason))
		}
		if c.Evidence != "" {
			attrs = append(attrs, slog.String("evidence", c.Evidence))
		}
		if c.Err != nil {
			attrs = append(attrs, slog.Any("err", c.Err))
		}
		t.logger.LogAttrs(ctx, level, "kumi: ownership change", attrs...)
	}
}

// LeaseOperation counts one lease-store call in kumi.lease.operations (with
// kumi.outcome ok or error) and its latency, measured from start, in
// kumi.lease.duration. A failure is also added to ctx's span as a
// kumi.lease.error event and logged at Warn. It creates no span: the ownership changes the call
// causes have their own.
//
//	start := time.Now()
//	held, err := leases.Renew(ctx, …)
//	tel.LeaseOperation(ctx, sub, observability.LeaseRenew, start, err)
func (t *Telemetry) LeaseOperation(ctx context.Context, subscription string, op LeaseOp, start time.Time, err error) {
	if t == nil {
		return
	}
	d := time.Since(start).Seconds()
	outcome := outcomeOf(err)
	t.inst.leaseOps.Add(ctx, 1, metric.WithAttributes(
		attribute.String(obsname.AttrSubscription, subscription),
		attribute.String(obsname.AttrOperation, string(op)),
		attribute.String(obsname.AttrOutcome, outcome)))
	t.inst.leaseDur.Record(ctx, d, metric.WithAttributes(
		attribute.String(obsname.AttrSubscription, subscription),
		attribute.String(obsname.AttrOperation, string(op))))
	if err != nil {
		if span, ok := recording(ctx); ok {
			span.AddEvent(obsname.EventLeaseError, trace.WithAttributes(
				attribute.String(obsname.AttrOperation, string(op)),
				attribute.String("exception.message", err.Error())))
		}
		t.logger.LogAttrs(ctx, slog.LevelWarn, "kumi: lease operation failed",
			slog.String("subscription", subscription), slog.String("operation", string(op)), slog.Any("err", err))
	}
}

// LatePass describes a lease pass that ran late (see [Telemetry.LeasePassLate]).
type LatePass struct {
	Subscription, Worker string
	// Duration is how long the pass took; Gap the time from the start of
	// the last successful pass to this one's end, the time the leases went
	// without renewal.
	Duration, Gap time.Duration
	// Heartbeat, TTL and Margin are the group's lease timings.
	Heartbeat, TTL, Margin time.Duration
}

// LeasePassLate counts a lease pass that ran late in kumi.lease.passes.late
// and logs it at Warn with its timings: a renewal gap nearing TTL − margin
// stops the readers on unsure leases, and past the TTL other workers take
// the buckets over.
func (t *Telemetry) LeasePassLate(ctx context.Context, p LatePass) {
	if t == nil {
		return
	}
	t.inst.passesLate.Add(ctx, 1, metric.WithAttributes(attribute.String(obsname.AttrSubscription, p.Subscription)))
	t.logger.LogAttrs(ctx, slog.LevelWarn, "kumi: lease pass ran late; the database or this process is too slow for the lease timings",
		slog.String("subscription", p.Subscription), slog.String("worker", p.Worker),
		slog.Duration("duration", p.Duration), slog.Duration("gap", p.Gap),
		slog.Duration("heartbeat", p.Heartbeat), slog.Duration("ttl", p.TTL), slog.Duration("margin", p.Margin))
}
