package main

import (
	"context"
	"errors"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
)

// waitHandled returns once subscription has handled the event at version
// of stream, whichever copy of the program handled it: when the checkpoint
// of the bucket that holds it, in the serving generation, has reached its
// position. (After a resize's switch the new generation's checkpoints
// start at the cut, past every event the old generation drained.) It
// returns ctx's error if ctx ends first.
func waitHandled(ctx context.Context, store *eventsource.Store, subscription, stream string, version int64) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		done, err := handled(ctx, store, subscription, stream, version)
		if done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// handled is one look of waitHandled's: false until the event is
// sequenced and the subscription exists.
func handled(ctx context.Context, store *eventsource.Store, subscription, stream string, version int64) (bool, error) {
	evs, err := store.ReadStream(ctx, stream, version, 1)
	if err != nil || len(evs) == 0 || evs[0].Position == 0 {
		return false, err
	}
	r, err := leasestore.ReadResize(ctx, store.Pool(), store.Schema(), subscription)
	if errors.Is(err, leasestore.ErrNoSubscription) {
		return false, nil // Run has not created it yet
	}
	if err != nil {
		return false, err
	}
	cp, err := store.Checkpoint(ctx, subscription, eventsource.Slot(r.Generation, evs[0].Bucket(r.Buckets)))
	return cp >= evs[0].Position, err
}
