package main

import (
	"errors"
	"fmt"

	"github.com/kumi-run/kumi/internal/admin"
)

// adminError words an internal/admin refusal in the CLI's terms, with its
// flags' names: a usage error for what the command line got wrong. Other
// errors are the store's, asUsage's verdict on them.
func (e *env) adminError(err error) error {
	var r *admin.Refusal
	if !errors.As(err, &r) {
		return asUsage(notMigrated(e, err))
	}
	switch {
	case errors.Is(r.Reason, admin.ErrUnknownSubscription):
		return unknownSubscription(r.Subscription, e.schema)
	case errors.Is(r.Reason, admin.ErrBadBucket):
		return usageErrorf("--bucket %d: buckets are numbered from 0", r.Bucket)
	case errors.Is(r.Reason, admin.ErrBucketOutOfRange):
		return usageErrorf("--bucket %d: subscription %q has buckets 0 to %d", r.Bucket, r.Subscription, r.Buckets-1)
	case errors.Is(r.Reason, admin.ErrBadPosition):
		return usageErrorf("--position %d: positions are >= 0", r.Position)
	case errors.Is(r.Reason, admin.ErrNoBuckets):
		return usageErrorf("say which buckets: --bucket B (repeatable) or --all-buckets (not both)")
	case errors.Is(r.Reason, admin.ErrPastHead):
		return usageErrorf("--position %d is past the store's head (%d): the bucket would skip every event "+
			"until the head passes %d; pass --beyond-head if that is what you want", r.Position, r.Head, r.Position)
	case errors.Is(r.Reason, admin.ErrBucketsUnknown):
		return fmt.Errorf("subscription %q has no lease rows, so its bucket count is unknown: name the buckets with --bucket",
			r.Subscription)
	case r.Kind == admin.BadInput:
		return usageErrorf("%s", r.Error())
	}
	return r
}
