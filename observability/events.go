package observability

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/kumi-run/kumi/internal/obsname"
)

// OverflowInfo describes one overflow of a reader's bounded queue.
type OverflowInfo struct {
	// Subscription and Bucket say whose queue overflowed; Bucket is the
	// store's slot, carried split as in OwnershipChange.
	Subscription string
	Bucket       int
	// Policy is one of the Policy* constants.
	Policy string
	// Depth and Capacity of the queue when it overflowed.
	Depth, Capacity int
	// Dropped is how many live batches the policy discarded from the
	// queue: the one that found it full and those it held (PauseAndResume
	// drops the stale queue and re-reads it from the checkpoint, so nothing
	// is lost). Batches dropped before, and counted already, are not in it.
	Dropped int
}

// Overflow records that a reader queue overflowed and its policy was
// applied: kumi.queue.overflows +1 and kumi.queue.dropped +Dropped, per
// subscription and policy. If ctx carries a recording span (the publisher's
// fetch, when the overflow happens during its fan-out) a kumi.overflow event
// is added to it; otherwise a short kumi.overflow span is recorded. Logged
// at Debug for PauseAndResume, which is ordinary back-pressure, and at Warn
// for the other policies.
//
// It must not block: the mailbox may call it while posting.
func (t *Telemetry) Overflow(ctx context.Context, o OverflowInfo) {
	if t == nil {
		return
	}
	attrs := func() []attribute.KeyValue {
		return []attribute.KeyValue{
			attribute.String(obsname.AttrSubscription, o.Subscription),
			attribute.Int(obsname.AttrGeneration, slotGeneration(o.Bucket)),
			attribute.Int(obsname.AttrBucket, slotBucket(o.Bucket)),
			attribute.String(obsname.AttrPolicy, o.Policy),
			attribute.Int(obsname.AttrDepth, o.Depth),
			attribute.Int(obsname.AttrCapacity, o.Capacity),
			attribute.Int(obsname.AttrDropped, o.Dropped),
		}
	}
	if span, ok := recording(ctx); ok {
		span.AddEvent(obsname.EventOverflow, trace.WithAttributes(attrs()...))
	} else {
		_, span := t.tracer.Start(ctx, obsname.SpanOverflow, internalSpan...)
		if span.IsRecording() {
			span.SetAttributes(attrs()...)
		}
		span.End()
	}
	m := t.measure(measureKey{kind: measureOverflow, sub: o.Subscription, s: o.Policy})
	t.inst.overflows.Add(ctx, 1, m.add...)
	if o.Dropped > 0 {
		t.inst.dropped.Add(ctx, int64(o.Dropped), m.add...)
	}
	level := slog.LevelWarn
	if o.Policy == obsname.PolicyPauseAndResume {
		level = slog.LevelDebug
	}
	if t.logger.Enabled(ctx, level) {
		t.logger.LogAttrs(ctx, level, "kumi: reader queue overflow",
			slog.String("subscription", o.Subscription),
			slog.Int("generation", slotGeneration(o.Bucket)), slog.Int("bucket", slotBucket(o.Bucket)),
			slog.String("policy", o.Policy), slog.Int("depth", o.Depth),
			slog.Int("capacity", o.Capacity), slog.Int("dropped", o.Dropped))
	}
}

// QueueDropped records live batches a reader queue dropped other than by
// an overflow (see [Telemetry.Overflow]) — evicted under DropOldest to make
// room for a newer batch, or refused while the queue was paused — in
// kumi.queue.dropped, per subscription and policy. It records nothing
// else, no span and no log line: under DropOldest it runs for every
// eviction, while the queue is locked. It must not block.
func (t *Telemetry) QueueDropped(ctx context.Context, subscription, policy string, batches int) {
	if t == nil || batches <= 0 {
		return
	}
	m := t.measure(measureKey{kind: measureOverflow, sub: subscription, s: policy})
	t.inst.dropped.Add(ctx, int64(batches), m.add...)
}

// SupervisionInfo describes one supervision decision about a failed actor.
type SupervisionInfo struct {
	// Actor is the failed actor's kind — "coordinator", "reader",
	// "publisher", "handler", … — a low-cardinality metric attribute.
	Actor string
	// Child identifies the failed actor (its PID); spans and logs only.
	Child string
	// Subscription the actor serves, if any.
	Subscription string
	// Strategy is the supervisor's strategy, e.g. "one_for_one",
	// "all_for_one".
	Strategy string
	// Directive is one of the Directive* constants.
	Directive string
	// Reason is the failure.
	Reason error
	// Restarts is the number of failures within the retry window,
	// including this one.
	Restarts int
	// Backoff is the delay before a restart, if any.
	Backoff time.Duration
}

// SupervisionDecision records a supervisor's decision: a
// kumi.supervision.decision event on ctx's recording span, or a short
// kumi.supervision span when there is none (supervisors run outside any
// request); kumi.supervision.decisions per actor and directive, and
// kumi.supervision.restarts for restarts. Logged at Warn for restart and
// resume, Info for stop (a lost fence stops a reader by design), Error for
// escalate.
func (t *Telemetry) SupervisionDecision(ctx context.Context, s SupervisionInfo) {
	if t == nil {
		return
	}
	attrs := func() []attribute.KeyValue {
		kv := []attribute.KeyValue{
			attribute.String(obsname.AttrActor, s.Actor),
			attribute.String(obsname.AttrDirective, s.Directive),
			attribute.Int(obsname.AttrRestarts, s.Restarts),
		}
		if s.Child != "" {
			kv = append(kv, attribute.String(obsname.AttrChild, s.Child))
		}
		if s.Subscription != "" {
			kv = append(kv, attribute.String(obsname.AttrSubscription, s.Subscription))
		}
		if s.Strategy != "" {
			kv = append(kv, attribute.String(obsname.AttrStrategy, s.Strategy))
		}
		if s.Backoff > 0 {
			kv = append(kv, attribute.Float64(obsname.AttrBackoff, s.Backoff.Seconds()))
		}
		if s.Reason != nil {
			kv = append(kv, attribute.String(obsname.AttrReason, s.Reason.Error()))
		}
		return kv
	}
	if span, ok := recording(ctx); ok {
		span.AddEvent(obsname.EventSupervision, trace.WithAttributes(attrs()...))
	} else {
		_, span := t.tracer.Start(ctx, obsname.SpanSupervision, internalSpan...)
		if span.IsRecording() {
			span.SetAttributes(attrs()...)
			span.AddEvent(obsname.EventSupervision)
		}
		span.End()
	}
	t.inst.decisions.Add(ctx, 1, metric.WithAttributes(
		attribute.String(obsname.AttrActor, s.Actor), attribute.String(obsname.AttrDirective, s.Directive)))
	if s.Directive == obsname.DirectiveRestart {
		t.inst.restarts.Add(ctx, 1, metric.WithAttributes(attribute.String(obsname.AttrActor, s.Actor)))
	}
	level := slog.LevelWarn
	switch s.Directive {
	case obsname.DirectiveStop:
		level = slog.LevelInfo
	case obsname.DirectiveEscalate:
		level = slog.LevelError
	}
	if t.logger.Enabled(ctx, level) {
		la := []slog.Attr{
			slog.String("actor", s.Actor), slog.String("directive", s.Directive),
			slog.Int("restarts", s.Restarts),
		}
		if s.Child != "" {
			la = append(la, slog.String("child", s.Child))
		}
		if s.Subscription != "" {
			la = append(la, slog.String("subscription", s.Subscription))
		}
		if s.Strategy != "" {
			la = append(la, slog.String("strategy", s.Strategy))
		}
		if s.Backoff > 0 {
			la = append(la, slog.Duration("backoff", s.Backoff))
		}
		if s.Reason != nil {
			la = append(la, slog.Any("err", s.Reason))
		}
		t.logger.LogAttrs(ctx, level, "kumi: supervision decision", la...)
	}
}

// NotifierReconnect records that the notifier's LISTEN connection is being
// re-established after err (attempt counts from 1 since the last healthy
// connection): kumi.notifier.reconnects +1, an event on ctx's recording
// span, and a Warn log (Debug for a first attempt with a nil error, such as
// a planned reconnect).
func (t *Telemetry) NotifierReconnect(ctx context.Context, attempt int, err error) {
	if t == nil {
		return
	}
	t.inst.reconnects.Add(ctx, 1)
	if span, ok := recording(ctx); ok {
		kv := []attribute.KeyValue{attribute.Int(obsname.AttrAttempt, attempt)}
		if err != nil {
			kv = append(kv, attribute.String(obsname.AttrReason, err.Error()))
		}
		span.AddEvent(obsname.EventNotifierReconnect, trace.WithAttributes(kv...))
	}
	level := slog.LevelWarn
	if err == nil && attempt <= 1 {
		level = slog.LevelDebug
	}
	if t.logger.Enabled(ctx, level) {
		t.logger.LogAttrs(ctx, level, "kumi: notifier reconnecting", slog.Int("attempt", attempt), slog.Any("err", err))
	}
}
