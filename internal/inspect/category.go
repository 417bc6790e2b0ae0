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
// events, by name: a skip scan of the appends' (category, position) index,
// one probe per category.
func Categories(ctx context.Context, store *eventsource.Store, limit int) ([]string, error) {
	q := store.QuotedSchema()
	rows, err := store.Pool().Query(ctx, `WITH RECURSIVE c(category) AS (
		(SELECT category FROM `+q+`.appends WHERE last_position IS NOT NULL ORDER BY category LIMIT 1)
		UNION ALL
		SELECT (SELECT a.category FROM `+q+`.appends a
		         WHERE a.last_position IS NOT NULL AND a.category > c.category ORDER BY a.category LIMIT 1)
		  FROM c WHERE c.category IS NOT NULL
	) SELECT category FROM c WHERE category IS NOT NULL LIMIT $1`, limit)
	if err != nil {
		return nil, notMigrated(store.Schema(), err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, notMigrated(store.Schema(), rows.Err())
}
