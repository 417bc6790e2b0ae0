package observability

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/kumi-run/kumi/internal/obsname"
)

// PassSummary is what a reconcile pass did, reported when it ends.
type PassSummary struct {
	// LiveWorkers is the number of live workers the pass saw, FairShare
	// ceil(N / LiveWorkers), Owned the buckets held after the pass.
	LiveWorkers, FairShare, Owned int
	// Counts of this pass's ownership changes, by kind.
	Claimed, Taken, Stolen, Given, Shed, Released, Lost int
	// Err is the error that cut the pass short, if any.
	Err error
}

func (s PassSummary) changed() bool {
	return s.Claimed+s.Taken+s.Stolen+s.Given+s.Released+s.Lost > 0
}

// ReconcileSpan is an open reconcile pass; end it with End. The zero value
// is a no-op.
type ReconcileSpan struct {
	t            *Telemetry
	span         trace.Span
	start        time.Time
	subscription string
}

// StartReconcile opens a kumi.reconcile span for one coordinator pass and
// returns its context: pass that context to OwnershipChange and
// LeaseOperation during the pass so the changes nest under it. Each pass
// starts a new trace unless ctx already carries a span.
func (t *Telemetry) StartReconcile(ctx context.Context, subscription, worker string) (context.Context, ReconcileSpan) {
	if t == nil {
		return ctx, ReconcileSpan{}
	}
	ctx, span := t.tracer.Start(ctx, obsname.SpanReconcile, internalSpan...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String(obsname.AttrSubscription, subscription),
			attribute.String(obsname.AttrWorker, worker))
	}
	return ctx, ReconcileSpan{t: t, span: span, start: time.Now(), subscription: subscription}
}

// End closes the pass: the summary becomes span attributes, the duration
// goes to kumi.reconcile.duration, and a pass that changed the set of owned
// buckets (anything but shed, which only starts a handoff) counts in
// kumi.rebalances.
func (r ReconcileSpan) End(s PassSummary) {
	if r.t == nil {
		return
	}
	if r.span.IsRecording() {
		r.span.SetAttributes(
			attribute.Int(obsname.AttrLiveWorkers, s.LiveWorkers),
			attribute.Int(obsname.AttrFairShare, s.FairShare),
			attribute.Int(obsname.AttrOwned, s.Owned),
			attribute.Int(obsname.AttrClaimed, s.Claimed),
			attribute.Int(obsname.AttrTaken, s.Taken),
			attribute.Int(obsname.AttrStolen, s.Stolen),
			attribute.Int(obsname.AttrGiven, s.Given),
			attribute.Int(obsname.AttrShed, s.Shed),
			attribute.Int(obsname.AttrReleased, s.Released),
			attribute.Int(obsname.AttrLost, s.Lost),
		)
		if s.Err != nil {
			r.span.RecordError(s.Err)
			r.span.SetStatus(codes.Error, s.Err.Error())
		}
	}
	r.span.End()
	ctx := context.Background()
	r.t.inst.reconcileDur.Record(ctx, time.Since(r.start).Seconds(), metric.WithAttributes(
		attribute.String(obsname.AttrSubscription, r.subscription),
		attribute.String(obsname.AttrOutcome, outcomeOf(s.Err))))
	if s.changed() {
		r.t.inst.rebalances.Add(ctx, 1, metric.WithAttributes(attribute.String(obsname.AttrSubscription, r.subscription)))
	}
}
