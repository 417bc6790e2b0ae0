package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
)

// ResizeOptions are the options of [Resize].
type ResizeOptions struct {
	// EvictOldWorkers resizes although workers of a kumi version that
	// predates resizes are live: they are fenced out, and their buckets
	// move after a TTL (see docs/design/resize.md).
	EvictOldWorkers bool
	// By says who asks, for status ("" = unknown).
	By string
	// Wait follows the resize to its end: Resize returns once the new
	// generation serves (or the resize was cancelled), else once it is
	// requested.
	Wait bool
	// Progress, when set, is called with the resize as read each time it
	// changes while Resize waits.
	Progress func(leasestore.Resize)
	// Poll is how often a waiting Resize reads the resize; 0 means 100 ms.
	Poll time.Duration
}

// ErrResizeCancelled is returned by a waiting [Resize] when the resize it
// follows was cancelled (by [CancelResize] or `kumi resize --cancel`)
// before it completed: the subscription keeps its bucket count.
var ErrResizeCancelled = inspect.ErrResizeCancelled

// Resize changes a subscription's bucket count to buckets while its
// workers run (docs/design/resize.md): no event lost, none delivered twice on the
// graceful path, every stream's events delivered in order across the
// change, no restart. It builds the consumer-group index for buckets first
// (CREATE INDEX CONCURRENTLY, a no-op when it is valid: the caller's role
// must be able to create it, or build it ahead with `kumi migrate
// --group-size`), then requests the resize; the workers do it, and learn
// of it by notification or on their next pass. Nobody drives it: if the
// caller goes away, the resize goes on.
//
// With opts.Wait it follows the resize until the new generation serves
// and returns it; a resize cancelled meanwhile returns
// [ErrResizeCancelled], and ctx ending returns ctx.Err() with the resize
// left running. Without it, it returns once the resize is requested.
//
// The refusals are leasestore's, typed: a bucket count outside [1,
// leasestore.MaxBuckets] (*kumierr.ConfigError naming actors buckets),
// leasestore.ErrSameBuckets, leasestore.ErrNoSubscription (no worker has
// started it), *leasestore.ResizeInProgressError,
// *leasestore.OldWorkersError, leasestore.ErrIndexMissing (a
// *kumierr.ConfigError naming leasestore.ResizeRequest.Buckets).
func Resize(ctx context.Context, store *eventsource.Store, subscription string, buckets int, opts ResizeOptions) (leasestore.Resize, error) {
	if store == nil {
		return leasestore.Resize{}, &kumierr.ConfigError{Field: "actors store", Reason: "is required"}
	}
	if buckets < 1 || buckets > leasestore.MaxBuckets {
		return leasestore.Resize{}, &kumierr.ConfigError{Field: "actors buckets", Value: buckets,
			Reason: fmt.Sprintf("must be between 1 and %d (leasestore.MaxBuckets)", leasestore.MaxBuckets)}
	}
	if err := store.EnsureConsumerGroupIndex(ctx, buckets); err != nil {
		return leasestore.Resize{}, err
	}
	r, err := leasestore.RequestResize(ctx, store.Pool(), store.Schema(), leasestore.ResizeRequest{
		Subscription: subscription, Buckets: buckets, By: opts.By, EvictOldWorkers: opts.EvictOldWorkers,
	})
	if err != nil || !opts.Wait {
		return r, err
	}
	return FollowResize(ctx, store, r, opts)
}

// FollowResize follows a requested resize (r, as [leasestore.RequestResize]
// returned it, or as read while it runs) until the next generation serves,
// calling opts.Progress on each change; a resize cancelled meanwhile
// returns [ErrResizeCancelled], and ctx ending returns ctx.Err() with the
// resize left running.
func FollowResize(ctx context.Context, store *eventsource.Store, r leasestore.Resize, opts ResizeOptions) (leasestore.Resize, error) {
	return inspect.FollowResize(ctx, store.Pool(), store.Schema(), r, opts.Poll, opts.Progress)
}

// CancelResize cancels a subscription's resize before its switch (the
// first new bucket starting): the workers go on with the old bucket count
// from where they are. After the switch it refuses with
// *leasestore.ResizeSwitchedError and changes nothing (resize back
// instead); with no resize running, leasestore.ErrNoResize.
func CancelResize(ctx context.Context, store *eventsource.Store, subscription string) (leasestore.Resize, error) {
	if store == nil {
		return leasestore.Resize{}, &kumierr.ConfigError{Field: "actors store", Reason: "is required"}
	}
	return leasestore.CancelResize(ctx, store.Pool(), store.Schema(), subscription)
}
