package actors_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
)

// A batch handler receives up to Batch.MaxEvents of a bucket's events at
// once, in order, and answers once: nil acks them all; DoneUpTo says how
// far it got, and the rest is retried from there (or, with Permanent, the
// event it stopped at is dead-lettered and the rest comes in the next
// batch).
func ExampleBatchFunc() {
	handler := actors.BatchFunc(func(ctx context.Context, b *actors.Batch) error {
		for i, e := range b.Events {
			if len(e.Data) > 1<<20 {
				return actors.DoneUpTo(i, actors.Permanent(fmt.Errorf("event %s: too large", e.ID)))
			}
			if err := callService(ctx, e.Data); err != nil {
				return actors.DoneUpTo(i, err) // events before i are done; retried from i
			}
		}
		return nil
	})
	_ = actors.GroupOptions{Subscription: "mailer", Category: "order", Buckets: 16, Handler: handler,
		Batch: actors.BatchOptions{MaxEvents: 500, MaxBytes: 4 << 20}}
}

// A batch's writes and the checkpoint commit together, fenced, or not at
// all: CommitBatchWithCheckpoint gives fn only the events the checkpoint
// does not already cover.
func ExampleCommitBatchWithCheckpoint() {
	var store *eventsource.Store // the runtime's store
	project := actors.BatchFunc(func(ctx context.Context, b *actors.Batch) error {
		return actors.CommitBatchWithCheckpoint(ctx, store, b, func(ctx context.Context, tx pgx.Tx, events []eventsource.RecordedEvent) error {
			for _, e := range events {
				if _, err := tx.Exec(ctx, `UPDATE balances SET total = total + 1 WHERE account = $1`, e.Stream); err != nil {
					return err
				}
			}
			return nil
		})
	})
	_ = actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 16, Handler: project,
		Batch: actors.BatchOptions{MaxEvents: 200}}
}
