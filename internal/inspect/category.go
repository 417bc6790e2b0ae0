package inspect

import (
	"context"
	"fmt"
	"strings"

	"github.com/kumi-run/kumi/eventsource"
)

// CategoryError reports a category that cannot be the subscription's: it
// has no events, yet the subscription's workers have checkpointed events of
// theirs (a mistyped -c measures a lag of 0 everywhere: "all caught up").
// The lease tables do not record a subscription's category, so this is
// what can be told apart.
type CategoryError struct {
	Subscription, Category string
	// Checkpoint is the subscription's furthest checkpoint (generation 0's:
	// later generations start from a cut, not from one of its events).
	Checkpoint int64
	// Categories are some of the categories that have events, by name.
	Categories []string
}

func (e *CategoryError) Error() string {
	msg := fmt.Sprintf("category %q has no events, yet subscription %q has handled events up to position %d: "+
		"it is not the subscription's category", e.Category, e.Subscription, e.Checkpoint)
	if len(e.Categories) > 0 {
		msg += " (categories with events: " + strings.Join(e.Categories, ", ") + ")"
	}
	return msg
}

// knownCategories is how many categories an error or a warning names.
const knownCategories = 8

// checkCategory refuses a category that has no events while the
// subscription has checkpointed some ([CategoryError]), and marks one that
// has no events at all on a subscription with nothing handled yet
// (CategoryEmpty): then a lag of 0 means nothing to read, not caught up.
func checkCategory(ctx context.Context, reads *eventsource.Store, in *Inspection) error {
	some, err := reads.ReadCategory(ctx, in.Category, 0, 1)
	if err != nil {
		return fmt.Errorf("events of category %q: %w", in.Category, notMigrated(reads.Schema(), err))
	}
	if len(some) > 0 {
		return nil
	}
	known, err := Categories(ctx, reads, knownCategories)
	if err != nil {
		return err
	}
	var furthest int64
	for _, c := range in.Checkpoints {
		if g, _ := eventsource.SlotBucket(c.Bucket); g == 0 {
			furthest = max(furthest, c.Position)
		}
	}
	if furthest > 0 {
		return &CategoryError{Subscription: in.Subscription, Category: in.Category, Checkpoint: furthest, Categories: known}
	}
	in.CategoryEmpty, in.Categories = true, known
	return nil
}

// Categories returns up to limit of the categories that have sequenced
// events, by name ([eventsource.Store.Categories]), saying so when the
// schema is not migrated.
func Categories(ctx context.Context, store *eventsource.Store, limit int) ([]string, error) {
	cats, err := store.Categories(ctx, limit)
	return cats, notMigrated(store.Schema(), err)
}
