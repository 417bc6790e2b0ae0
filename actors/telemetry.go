package actors

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

// telemetry adapts the runtime's events to package observability: the one
// place where the actors meet OpenTelemetry.
type telemetry struct {
	t            *observability.Telemetry
	subscription string
	worker       string
}

func newTelemetry(t *observability.Telemetry, logger *slog.Logger) *telemetry {
	if t == nil {
		t = observability.New(observability.Options{Logger: logger})
	}
	return &telemetry{t: t}
}

func (t *telemetry) forGroup(subscription, worker string) *telemetry {
	return &telemetry{t: t.t, subscription: subscription, worker: worker}
}

// startFetch opens the publisher's fetch span.
func (t *telemetry) startFetch(ctx context.Context, from int64, subscribers int) (context.Context, observability.FetchSpan) {
	return t.t.StartPublisherFetch(ctx, from, subscribers)
}

// startReaderFetch opens a reader's catch-up read span.
func (t *telemetry) startReaderFetch(ctx context.Context, bucket int, from int64) (context.Context, observability.FetchSpan) {
	return t.t.StartReaderFetch(ctx, t.subscription, bucket, from)
}

// startDelivery opens the delivery span as a child of the trace that
// appended the event, and returns the context for the handler and the
// function that ends the span with its outcome.
func (t *telemetry) startDelivery(bg context.Context, d *Delivery) (context.Context, observability.DeliverySpan) {
	parent := eventsource.TraceContext(bg, d.Event.Metadata)
	return t.t.StartDelivery(parent, observability.DeliveryInfo{
		Subscription: d.Subscription, Bucket: eventsource.Slot(d.Generation, d.Bucket), Worker: t.worker,
		Category: d.Event.Category, Stream: d.Event.Stream, EventUUID: d.Event.ID,
		EventType: d.Event.Type, Version: d.Event.Version, Position: d.Event.Position, Attempt: d.Attempt,
	})
}

func (t *telemetry) startReconcile(ctx context.Context) (context.Context, observability.ReconcileSpan) {
	return t.t.StartReconcile(ctx, t.subscription, t.worker)
}

// ownership records one ownership change.
func (t *telemetry) ownership(ctx context.Context, kind observability.ChangeKind, bucket int, epoch int64, peer, reason, evidence string, err error) {
	t.t.OwnershipChange(ctx, observability.OwnershipChange{
		Kind: kind, Subscription: t.subscription, Bucket: bucket, Worker: t.worker, Epoch: epoch,
		Peer: peer, Reason: reason, Evidence: evidence, Err: err,
	})
}

// passChanges records the ownership changes a pass reports and returns
// their summary.
func (t *telemetry) passChanges(ctx context.Context, res leasestore.PassResult, prev map[int]leasestore.Lease, shedding map[int]bool) observability.PassSummary {
	s := observability.PassSummary{LiveWorkers: res.Live, FairShare: res.FairShare, Owned: len(res.Owned)}
	taken := map[int]leasestore.Takeover{}
	for _, tk := range res.Takeovers {
		taken[tk.Bucket] = tk
	}
	for _, l := range res.Claimed {
		tk, ok := taken[l.Slot]
		switch {
		case ok && tk.Evidence == leasestore.EvidenceHandoff:
			s.Taken++
			t.ownership(ctx, observability.ChangeHandoffTake, l.Slot, l.Epoch, tk.From, "handed over", tk.Evidence, nil)
		case ok && tk.From != "":
			s.Stolen++
			t.ownership(ctx, observability.ChangeSteal, l.Slot, l.Epoch, tk.From, "owner not live", tk.Evidence, nil)
		default:
			s.Claimed++
			t.ownership(ctx, observability.ChangeClaim, l.Slot, l.Epoch, "", "free bucket", tk.Evidence, nil)
		}
	}
	for _, r := range res.Requested {
		t.ownership(ctx, observability.ChangeHandoffRequest, r.Bucket, 0, r.Owner, "below fair share", "", nil)
	}
	for _, b := range res.Lost {
		s.Lost++
		t.ownership(ctx, observability.ChangeRenewFailed, b, prev[b].Epoch, "", "lease no longer held", "", nil)
	}
	for _, b := range res.HandOff {
		if !shedding[b] {
			s.Shed++
			t.ownership(ctx, observability.ChangeShed, b, prev[b].Epoch, "", "a claimant waits", "", nil)
		}
	}
	return s
}

func (t *telemetry) lease(ctx context.Context, op observability.LeaseOp, start time.Time, err error) {
	t.t.LeaseOperation(ctx, t.subscription, op, start, err)
}

// queueTransition reports a reader queue's pause or overflow, and counts
// in kumi.queue.dropped every batch the queue drops, once: those of a pause
// or an overflow with it, an eviction under DropOldest (which changes no
// state) at once, the batches refused while paused when the queue resumes.
// It returns one queue's callback.
func (t *telemetry) queueTransition(bucket int, policy overflow.Policy) func(overflow.Transition) {
	// counted is the queue's Stats.Dropped already counted. The queue calls
	// under its lock, one call at a time.
	var counted uint64
	return func(tr overflow.Transition) {
		dropped := int(tr.Stats.Dropped - counted)
		counted = tr.Stats.Dropped
		if tr.To == overflow.Active {
			t.t.QueueDropped(context.Background(), t.subscription, policy.String(), dropped)
			return
		}
		t.t.Overflow(context.Background(), observability.OverflowInfo{
			Subscription: t.subscription, Bucket: bucket, Policy: policy.String(),
			Depth: tr.Stats.Depth, Capacity: tr.Stats.Capacity, Dropped: dropped,
		})
	}
}

// fenceLost records a reader stopping on a lost fence.
func (t *telemetry) fenceLost(bucket int, epoch int64, err error) {
	t.ownership(context.Background(), observability.ChangeFenceLost, bucket, epoch, "", fmt.Sprint(err), "", err)
}
