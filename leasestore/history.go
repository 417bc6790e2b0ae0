package leasestore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/kumierr"
)

// OwnershipChange is one entry of the ownership record: a change of a
// bucket's owner, epoch or pending claim, a worker joining or leaving, or a
// step of a resize. The database writes it, in the transaction that made
// the change (migration 0005's triggers), so nothing changes ownership
// without one — not the lease store, not an operator, not a user's own SQL.
type OwnershipChange struct {
	ID int64 // grows with every change of the schema
	// At is the database's clock when the change was made (its
	// transaction commits at once after, or not at all).
	At           time.Time
	Subscription string
	// Kind is one of claim, handoff, steal, reclaim, release, drain,
	// request, withdraw, fence, remove (a lease row); join, leave (a
	// worker); resize (a step of a resize). docs/operations.md says what
	// each means.
	Kind string
	// Generation and Bucket name the bucket concerned; both are -1 for a
	// worker or a resize.
	Generation, Bucket int
	// From and To are the owners before and after (for a request: the
	// owner asked, and the claimant; for join and leave, the worker; for a
	// resize, the states before and after).
	From, To string
	Epoch    int64 // the lease's epoch after the change; 0 for a worker or a resize
	// Evidence is what the database saw that made the change possible: a
	// lapsed lease and its last renewal, a claim, a cut.
	Evidence string
	// Role and Application say who made it: the login role and its
	// application_name (a worker's id; `kumi <command>`; the console).
	Role, Application string
}

// OwnershipFilter selects entries of the ownership record.
type OwnershipFilter struct {
	Subscription string
	// Bucket, when Generation is at least 0, keeps that bucket's changes
	// (and those that name no bucket: workers and resizes); a Generation
	// of -1 keeps every bucket's.
	Generation, Bucket int
	// Since and Before bound the changes' times; zero means unbounded.
	Since, Before time.Time
	// Limit is the most entries returned, newest first; 0 means 100.
	Limit int
}

// ReadOwnership reads the ownership record, newest first. It writes
// nothing; an operator's role needs SELECT on ownership_changes.
func ReadOwnership(ctx context.Context, pool *pgxpool.Pool, schema string, f OwnershipFilter) ([]OwnershipChange, error) {
	if err := checkOperatorArgs(schema, f.Subscription); err != nil {
		return nil, err
	}
	if f.Limit < 0 {
		return nil, &kumierr.ConfigError{Field: "leasestore.OwnershipFilter.Limit", Value: f.Limit, Reason: "must not be negative"}
	}
	limit := f.Limit
	if limit == 0 {
		limit = 100
	}
	var gen, bucket *int
	if f.Generation >= 0 {
		gen, bucket = &f.Generation, &f.Bucket
	}
	var since, before *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	if !f.Before.IsZero() {
		before = &f.Before
	}
	rows, _ := pool.Query(ctx, renderStatements(schema).get("ownership_changes"), f.Subscription, gen, bucket, since, before, limit)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OwnershipChange, error) {
		c := OwnershipChange{Subscription: f.Subscription}
		err := r.Scan(&c.ID, &c.At, &c.Kind, &c.Generation, &c.Bucket, &c.From, &c.To, &c.Epoch, &c.Evidence,
			&c.Role, &c.Application)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("leasestore: read the ownership record: %w%s", err, migrateHint(err))
	}
	return out, nil
}

// OwnershipRetention returns how long the ownership record keeps a change.
func OwnershipRetention(ctx context.Context, pool *pgxpool.Pool, schema string) (time.Duration, error) {
	if schema == "" {
		return 0, &kumierr.ConfigError{Field: "leasestore schema", Reason: "is required"}
	}
	var keep time.Duration
	if err := pool.QueryRow(ctx, renderStatements(schema).get("ownership_retention")).Scan(&keep); err != nil {
		return 0, fmt.Errorf("leasestore: read the ownership record's retention: %w%s", err, migrateHint(err))
	}
	return keep, nil
}

// SetOwnershipRetention sets how long the ownership record keeps a change
// (7 days when migrated). Older changes are pruned as new ones are
// written. A negative keep is refused with a *kumierr.ConfigError.
func SetOwnershipRetention(ctx context.Context, pool *pgxpool.Pool, schema string, keep time.Duration) error {
	if schema == "" {
		return &kumierr.ConfigError{Field: "leasestore schema", Reason: "is required"}
	}
	if keep < 0 {
		return &kumierr.ConfigError{Field: "leasestore.SetOwnershipRetention keep", Value: keep, Reason: "must not be negative"}
	}
	if _, err := pool.Exec(ctx, renderStatements(schema).get("ownership_retention_set"), keep); err != nil {
		return fmt.Errorf("leasestore: set the ownership record's retention: %w%s", err, migrateHint(err))
	}
	return nil
}
