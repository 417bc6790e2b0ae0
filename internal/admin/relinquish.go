package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/leasestore"
)

// Handoff is a relinquish placed: the claim, and whether it puts the
// claimant above its fair share.
type Handoff struct {
	Bucket int // the serving generation's bucket
	Slot   int // its slot
	leasestore.HandoffRequest
	// Loads is each worker's load before the claim as leasestore's pass
	// counts it: the live buckets it owns that nobody claims, plus its own
	// pending claims (a bucket it is handing over is the claimant's).
	// HandoffRequest.Load counts such a bucket for its owner too; Load
	// below is Loads[To].
	Loads map[string]int
	Load  int
	// Share is leasestore.FairShare(Buckets, Live); AboveShare reports
	// that the claimant already held its share (Load >= Share), so that
	// its next pass may withdraw the claim and the owner keep the bucket.
	Share      int
	AboveShare bool
}

// Relinquish asks the live owner of the serving generation's bucket to
// hand it over to the live worker to (or, when to is "", the least loaded
// live worker other than the owner): leasestore.RequestHandoff, the first
// phase of the two-phase handoff. A negative bucket is refused, and so is
// what RequestHandoff refuses: a *Refusal with Reason ErrHandoffRefused
// wrapping the *leasestore.HandoffError.
func Relinquish(ctx context.Context, store *eventsource.Store, sub string, bucket int, to string) (Handoff, error) {
	if bucket < 0 {
		return Handoff{}, badBucket(sub, bucket)
	}
	if err := eventsource.ValidateSubscription(sub); err != nil {
		return Handoff{}, err
	}
	// The bucket is the serving generation's, as the map shows it.
	slot, err := inspect.ServingSlot(ctx, store, sub, bucket)
	if err != nil {
		return Handoff{}, err
	}
	req, err := leasestore.RequestHandoff(ctx, store.Pool(), store.Schema(), sub, slot, to)
	var h *leasestore.HandoffError
	switch {
	case errors.As(err, &h):
		return Handoff{}, handoffRefusal(h, bucket)
	case err != nil:
		return Handoff{}, fmt.Errorf("place the claim: %w", err)
	}
	loads := passLoads(req.Before)
	share := leasestore.FairShare(req.Buckets, max(req.Live, 1))
	return Handoff{Bucket: bucket, Slot: slot, HandoffRequest: req, Loads: loads, Load: loads[req.To], Share: share,
		AboveShare: loads[req.To] >= share}, nil
}

// passLoads counts each worker's load as leasestore's pass does: the live
// buckets it owns that nobody claims, plus its own pending claims.
func passLoads(snap leasestore.Snapshot) map[string]int {
	load := map[string]int{}
	for _, b := range snap.Buckets {
		switch {
		case b.ClaimWorker != "":
			load[b.ClaimWorker]++
		case b.Held(snap.Now):
			load[b.Owner]++
		}
	}
	return load
}

// handoffRefusal words a refused handoff request.
func handoffRefusal(h *leasestore.HandoffError, bucket int) *Refusal {
	row, sub := h.Lease, h.Subscription
	r := Refusal{Subscription: sub, Bucket: bucket, Buckets: h.Buckets}
	switch h.Reason {
	case leasestore.ErrNoBuckets:
		return refuse(NotFound, ErrHandoffRefused, h, r, "subscription %q has no buckets: no worker has started it", sub)
	case leasestore.ErrBucketOutOfRange:
		return refuse(BadInput, ErrHandoffRefused, h, r, "bucket %d: subscription %q has buckets 0 to %d", bucket, sub, h.Buckets-1)
	case leasestore.ErrBucketFree:
		return refuse(Conflict, ErrHandoffRefused, h, r, "bucket %d has no owner: nothing to hand over (a worker below its fair share claims it on its next pass)", bucket)
	case leasestore.ErrLeaseExpired:
		return refuse(Conflict, ErrHandoffRefused, h, r, "bucket %d's lease (owner %s) has expired: the next pass of any worker takes it without a handoff", bucket, row.Owner)
	case leasestore.ErrClaimPending:
		return refuse(Conflict, ErrHandoffRefused, h, r, "bucket %d already has a pending claim by %s: its owner %s is handing it over", bucket, row.ClaimWorker, row.Owner)
	case leasestore.ErrTargetIsOwner:
		return refuse(BadInput, ErrHandoffRefused, h, r, "%s is the bucket's owner", h.To)
	case leasestore.ErrTargetNotLive:
		return refuse(BadInput, ErrHandoffRefused, h, r, "%s is not a live worker of %q", h.To, sub)
	case leasestore.ErrNoOtherWorker:
		return refuse(Conflict, ErrHandoffRefused, h, r, "%s is the only live worker of %q: nobody could take bucket %d", row.Owner, sub, bucket)
	default: // leasestore.ErrHandoffRaced
		return refuse(Conflict, ErrHandoffRefused, h, r, "bucket %d changed while the claim was placed (owner, claim or %s's liveness): look again and retry", bucket, h.To)
	}
}
