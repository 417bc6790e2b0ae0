package eventsource

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Progress is what the store holds of one subscription's progress, read at
// one moment for an operator (`kumi status`, the console).
type Progress struct {
	// Now is the database's clock when it was read: the transaction's
	// start, so every read of the same transaction is judged against it.
	Now time.Time
	// Head is the store's last sequenced global position.
	Head int64
	// Checkpoints are the subscription's stored checkpoints, by bucket.
	Checkpoints []Checkpoint
}

// ProgressTx reads subscription's progress in tx. Run it in a repeatable
// read transaction together with other reads of the same moment — the
// lease table's (leasestore.ReadSnapshotTx) — so that they agree; it
// writes nothing and takes no lock a worker waits for.
func (s *Store) ProgressTx(ctx context.Context, tx pgx.Tx, subscription string) (Progress, error) {
	if err := ValidateSubscription(subscription); err != nil {
		return Progress{}, err
	}
	var p Progress
	if err := tx.QueryRow(ctx, s.sql.operatorNow).Scan(&p.Now, &p.Head); err != nil {
		return Progress{}, fmt.Errorf("kumi: read progress: %w", err)
	}
	rows, _ := tx.Query(ctx, s.sql.checkpointList, subscription)
	var err error
	p.Checkpoints, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Checkpoint, error) {
		var c Checkpoint
		err := r.Scan(&c.Bucket, &c.Position, &c.UpdatedAt)
		return c, err
	})
	if err != nil {
		return Progress{}, fmt.Errorf("kumi: read progress: %w", err)
	}
	return p, nil
}

// SubscriptionStats is one subscription as the store knows it: by its
// checkpoints and dead letters.
type SubscriptionStats struct {
	Subscription string // the subscription's name
	// Checkpoints is the number of buckets with a stored checkpoint in
	// the latest generation that has any: after a resize from 16 to 32
	// buckets, 32, not the 48 the two generations hold together (the
	// old generation's stay, as its history).
	Checkpoints int
	DeadLetters int // dead letters not replayed
}

// Subscriptions lists every subscription that has checkpoints or dead
// letters in the store, by name.
func (s *Store) Subscriptions(ctx context.Context) ([]SubscriptionStats, error) {
	return s.subscriptions(ctx, s.pool)
}

// SubscriptionsTx is [Store.Subscriptions] in tx, for a read that must
// agree with others of the same transaction.
func (s *Store) SubscriptionsTx(ctx context.Context, tx pgx.Tx) ([]SubscriptionStats, error) {
	return s.subscriptions(ctx, tx)
}

func (s *Store) subscriptions(ctx context.Context, db querier) ([]SubscriptionStats, error) {
	rows, _ := db.Query(ctx, s.sql.subscriptionList)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SubscriptionStats, error) {
		var st SubscriptionStats
		err := r.Scan(&st.Subscription, &st.Checkpoints, &st.DeadLetters)
		return st, err
	})
	if err != nil {
		return nil, fmt.Errorf("kumi: list subscriptions: %w", err)
	}
	return out, nil
}

// KnowsSubscription reports whether the store holds a checkpoint or a dead
// letter of subscription.
func (s *Store) KnowsSubscription(ctx context.Context, subscription string) (bool, error) {
	if err := ValidateSubscription(subscription); err != nil {
		return false, err
	}
	var known bool
	if err := s.pool.QueryRow(ctx, s.sql.subscriptionKnown, subscription).Scan(&known); err != nil {
		return false, fmt.Errorf("kumi: look up subscription: %w", err)
	}
	return known, nil
}

// CountCategoryTx counts the events of category in tx, sequenced or not:
// what a check compares with what its handlers recorded, in the same
// repeatable-read transaction. It reads the whole category.
func (s *Store) CountCategoryTx(ctx context.Context, tx pgx.Tx, category string) (int64, error) {
	if err := ValidateCategory(category); err != nil {
		return 0, err
	}
	var n int64
	if err := tx.QueryRow(ctx, s.sql.categoryCount, category).Scan(&n); err != nil {
		return 0, fmt.Errorf("kumi: count category: %w", err)
	}
	return n, nil
}
