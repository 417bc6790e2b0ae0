package admin

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/leasestore"
)

// Reset asks for checkpoints to be set to a position.
type Reset struct {
	Subscription string
	// Buckets are the serving generation's buckets to reset; AllBuckets
	// resets every one instead (the subscription's N must be known).
	Buckets    []int
	AllBuckets bool
	// Position is the new checkpoint: the bucket's next delivery is its
	// first event after it.
	Position int64
	// Force resets even a bucket a live owner holds (the owner is fenced
	// out); BeyondHead accepts a Position past the store's head.
	Force, BeyondHead bool
}

// BucketReset is what a reset did to one bucket.
type BucketReset struct {
	Bucket int
	Slot   int   // the serving generation's slot of Bucket
	Before int64 // the checkpoint before (0 when there was none)
	// Fenced is what the fence found and did: the earlier holders fenced
	// out, the live owner among them when forced.
	Fenced leasestore.FencedOut
	// Refused, when not nil, is why this bucket was left as it was: a
	// *Refusal with Reason ErrHeld wrapping the *leasestore.HeldError
	// (a live owner, without Force). The other buckets are still reset.
	Refused *Refusal
}

// ResetCheckpoints sets the checkpoints of the selected buckets of the
// serving generation to r.Position, bucket by bucket in ascending order,
// each write behind leasestore.OperatorFence, so that no earlier holder of
// the bucket — a lapsed owner that comes back, or the live one when forced
// — writes over it. It refuses (*Refusal) a bad selection, an unknown
// subscription, a bucket out of range and a position past the head unless
// r.BeyondHead before it writes anything; a bucket a live owner holds is
// refused in its BucketReset unless r.Force. The stores' other refusals
// (a resize in progress: *leasestore.ResizeInProgressError) end it, with
// the buckets reset so far.
func ResetCheckpoints(ctx context.Context, store *eventsource.Store, r Reset) ([]BucketReset, error) {
	sub := r.Subscription
	switch {
	case r.Position < 0:
		return nil, refuse(BadInput, ErrBadPosition, nil, Refusal{Subscription: sub, Position: r.Position},
			"position %d: the new checkpoint is a global position, an integer >= 0", r.Position)
	case len(r.Buckets) == 0 && !r.AllBuckets:
		return nil, refuse(BadInput, ErrNoBuckets, nil, Refusal{Subscription: sub}, "say which buckets to reset, or all of them")
	case len(r.Buckets) > 0 && r.AllBuckets:
		return nil, refuse(BadInput, ErrNoBuckets, nil, Refusal{Subscription: sub}, "name buckets or all of them, not both")
	}
	for _, b := range r.Buckets {
		if b < 0 {
			return nil, badBucket(sub, b)
		}
	}
	n, err := knownBuckets(ctx, store, sub)
	if err != nil {
		return nil, err
	}
	for _, b := range r.Buckets {
		if err := inRange(sub, b, n); err != nil {
			return nil, err
		}
	}
	head, err := store.HeadPosition(ctx)
	if err != nil {
		return nil, err
	}
	if r.Position > head && !r.BeyondHead {
		return nil, refuse(BadInput, ErrPastHead, nil, Refusal{Subscription: sub, Position: r.Position, Head: head},
			"position %d is past the store's head (%d): the bucket would skip every event until the head passes %d; "+
				"allow a position beyond the head if that is what you want", r.Position, head, r.Position)
	}
	buckets := slices.Clone(r.Buckets)
	if r.AllBuckets {
		if n == 0 {
			return nil, refuse(BadInput, ErrBucketsUnknown, nil, Refusal{Subscription: sub},
				"subscription %q has no lease rows, so its bucket count is unknown: name the buckets", sub)
		}
		for b := range n {
			buckets = append(buckets, b)
		}
	}
	slices.Sort(buckets)
	buckets = slices.Compact(buckets)
	var out []BucketReset
	for _, b := range buckets {
		// The bucket is the serving generation's, as the map shows it (a
		// retired generation's checkpoints are its record, never reset).
		slot, err := inspect.ServingSlot(ctx, store, sub, b)
		if err != nil {
			return out, err
		}
		before, err := store.Checkpoint(ctx, sub, slot)
		if err != nil {
			return out, err
		}
		br := BucketReset{Bucket: b, Slot: slot, Before: before}
		err = store.ResetCheckpoint(ctx, sub, slot, r.Position, leasestore.OperatorFence(store.Schema(), sub, slot, r.Force, &br.Fenced))
		var held *leasestore.HeldError
		switch {
		case errors.As(err, &held):
			br.Refused = refuse(Conflict, ErrHeld, held, Refusal{Subscription: sub, Bucket: b},
				"bucket %d is held by %s (epoch %d, lease expires in %v): stop the subscription's workers (or wait "+
					"until none holds it) and retry, or force it (the owner is then fenced out and its reader restarts "+
					"from the new checkpoint)", b, held.Owner, held.Epoch, held.ExpiresIn.Round(time.Second))
		case err != nil:
			return out, err
		}
		out = append(out, br)
	}
	return out, nil
}

// knownBuckets is sub's N (0 when no worker has started it), refusing a
// bad name and a subscription with no buckets, checkpoints or dead letters.
func knownBuckets(ctx context.Context, store *eventsource.Store, sub string) (int, error) {
	if err := eventsource.ValidateSubscription(sub); err != nil {
		return 0, err
	}
	n, known, err := inspect.Known(ctx, store, sub)
	switch {
	case err != nil:
		return 0, err
	case !known:
		return 0, refuse(NotFound, ErrUnknownSubscription, nil, Refusal{Subscription: sub},
			"subscription %q is unknown: it has no buckets, checkpoints or dead letters", sub)
	}
	return n, nil
}

func badBucket(sub string, b int) *Refusal {
	return refuse(BadInput, ErrBadBucket, nil, Refusal{Subscription: sub, Bucket: b}, "bucket %d: buckets are numbered from 0", b)
}

// inRange refuses bucket b of a subscription of n buckets (n 0: unknown).
func inRange(sub string, b, n int) error {
	if n > 0 && b >= n {
		return refuse(BadInput, ErrBucketOutOfRange, nil, Refusal{Subscription: sub, Bucket: b, Buckets: n},
			"bucket %d: subscription %q has buckets 0 to %d", b, sub, n-1)
	}
	return nil
}
