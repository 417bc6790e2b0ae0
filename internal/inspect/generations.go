package inspect

import (
	"context"
	"errors"
	"fmt"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
)

// GenerationRole is what a generation is to its subscription
// (docs/design/resize.md).
type GenerationRole string

// The roles of a generation.
const (
	// GenerationRetired: a resize replaced it; every one of its buckets
	// drained to the cut, and its checkpoints and dead letters stay as its
	// record.
	GenerationRetired GenerationRole = "retired"
	// GenerationServing: the generation whose buckets deliver.
	GenerationServing GenerationRole = "serving"
	// GenerationNext: the generation a running resize adds.
	GenerationNext GenerationRole = "next"
)

// Generation is one of a subscription's generations: a bucket count and
// its buckets, checkpoints and leases, keyed by slot (eventsource.Slot).
type Generation struct {
	// Generation is its number: 0 at creation, one more per completed
	// resize.
	Generation int
	Role       GenerationRole
	// Buckets is its N: for the serving and next generation as the lease
	// rows (or the resize) record it; for a retired one the number of its
	// checkpoints, as each of its buckets wrote one when it drained to
	// the cut. 0 when unknown: a subscription with neither lease rows nor
	// checkpoints.
	Buckets int
	// Cut is where a retired generation ended, the position its buckets
	// drained to (its highest checkpoint); 0 for the others.
	Cut int64
}

// ErrNoGeneration is what a *[GenerationError] wraps.
var ErrNoGeneration = errors.New("kumi: no such generation")

// GenerationError reports a generation that a subscription does not have:
// one below 0, or above its serving generation (above the next one during
// a resize).
type GenerationError struct {
	Subscription string
	Generation   int // the one asked for
	Highest      int // the subscription's highest generation
}

// Error names the generations the subscription has.
func (e *GenerationError) Error() string {
	if e.Generation < 0 {
		return fmt.Sprintf("generation %d: generations are numbered from 0", e.Generation)
	}
	have := fmt.Sprintf("its generations are 0 to %d", e.Highest)
	if e.Highest == 0 {
		have = "it has only generation 0: it was never resized"
	}
	return fmt.Sprintf("subscription %q has no generation %d (%s)", e.Subscription, e.Generation, have)
}

// Unwrap returns [ErrNoGeneration].
func (e *GenerationError) Unwrap() error { return ErrNoGeneration }

// Generations lists the subscription's generations, oldest first: the
// retired ones, the serving one and, while a resize runs, the next one.
// A subscription never resized (or without a subscriptions row) has
// generation 0 alone.
func (in Inspection) Generations() []Generation {
	serving := in.Resize.Generation
	out := make([]Generation, serving+1, serving+2)
	for g := range out {
		out[g] = Generation{Generation: g, Role: GenerationRetired}
	}
	out[serving].Role = GenerationServing
	for _, c := range in.Checkpoints {
		if g, _ := eventsource.SlotBucket(c.Bucket); g < serving {
			out[g].Buckets++
			out[g].Cut = max(out[g].Cut, c.Position)
		}
	}
	switch {
	case in.Buckets > 0:
		out[serving].Buckets = in.Buckets
	case in.Resize.Buckets > 0:
		out[serving].Buckets = in.Resize.Buckets
	}
	if in.Resize.Resizing() {
		out = append(out, Generation{Generation: serving + 1, Role: GenerationNext, Buckets: in.Resize.NextBuckets})
	}
	return out
}

// Generation returns generation g of the subscription, or a
// *[GenerationError] when it has none such.
func (in Inspection) Generation(g int) (Generation, error) {
	gens := in.Generations()
	if g < 0 || g >= len(gens) {
		return Generation{}, &GenerationError{Subscription: in.Subscription, Generation: g, Highest: len(gens) - 1}
	}
	return gens[g], nil
}

// MaxBuckets is the largest bucket count of the subscription's
// generations: a bucket number some generation has is below it (0 when
// none is known).
func (in Inspection) MaxBuckets() int {
	n := 0
	for _, g := range in.Generations() {
		n = max(n, g.Buckets)
	}
	return n
}

// ServingSlot returns the slot of bucket in the subscription's serving
// generation (eventsource.Slot): the bucket an operator names — to reset
// its checkpoint, to relinquish it — after a resize. A subscription
// without a subscriptions row (one an older version's workers made) was
// never resized: the slot is the bucket.
func ServingSlot(ctx context.Context, store *eventsource.Store, subscription string, bucket int) (int, error) {
	r, err := leasestore.ReadResize(ctx, store.Pool(), store.Schema(), subscription)
	switch {
	case errors.Is(err, leasestore.ErrNoSubscription):
		return bucket, nil
	case err != nil:
		return 0, notMigrated(store.Schema(), err)
	}
	return eventsource.Slot(r.Generation, bucket), nil
}
