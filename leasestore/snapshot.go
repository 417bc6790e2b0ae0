package leasestore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
)

// Snapshot is the lease table of one subscription at one moment.
type Snapshot struct {
	Subscription string // the store's subscription
	// Now is the database's clock when the snapshot was read; judge every
	// time of the snapshot against it.
	Now     time.Time
	Buckets []BucketState // sorted by bucket
	Workers []WorkerState // sorted by worker
}

// BucketState is one lease row. Zero times stand for NULL.
type BucketState struct {
	Bucket      int       // 0..BucketCount-1
	BucketCount int       // N
	Owner       string    // "" when free
	Epoch       int64     // grows by one on every change of owner and FenceOut
	GrantedAt   time.Time // when Owner got it
	Expires     time.Time // the lease's expiry (database clock)
	Heartbeat   time.Time // the owner's last renewal
	ClaimWorker string    // a pending two-phase claim; "" when none
	ClaimedAt   time.Time // when ClaimWorker placed it
	// Slot is the row's key, eventsource.Slot(Generation, Bucket); for a
	// subscription never resized, the bucket.
	Slot       int
	Generation int   // the bucket's generation (docs/design/resize.md)
	Proposal   int64 // an old bucket's cut proposal during a resize; -1: none
	Drained    bool  // an old bucket drained to the cut
}

// Held reports whether the bucket has an owner whose lease is unexpired at
// now (a database time, such as [Snapshot.Now]).
func (b BucketState) Held(now time.Time) bool { return b.Owner != "" && b.Expires.After(now) }

// WorkerState is one worker's row: a worker that has joined the
// subscription's pool, live or not.
type WorkerState struct {
	Worker     string    // the worker id
	Kind       Kind      // its lease kind
	Joined     time.Time // when its row was created
	Heartbeat  time.Time // its last heartbeat
	Expires    time.Time // when it stops counting as live without a heartbeat
	Live       bool      // unexpired at Snapshot.Now
	BackendPID int       // KindSession: the session's backend
	// SessionGone: KindSession, and its advisory lock is free — its
	// session is gone, whatever its expiry says.
	SessionGone bool
	// Protocol is the kumi protocol the worker speaks: 1 for versions that
	// predate resizes, 2 from the version that has them.
	Protocol int
}

// Snapshot reads the subscription's buckets and workers, consistently (one
// repeatable-read transaction), for operators, tests and the CLI.
func (s *Store) Snapshot(ctx context.Context) (Snapshot, error) {
	var snap Snapshot
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			snap, err = readSnapshot(ctx, tx, s.st, s.cfg.Subscription)
			return err
		})
	if err != nil {
		return Snapshot{}, fmt.Errorf("leasestore: snapshot: %w%s", err, migrateHint(err))
	}
	return snap, nil
}

// ReadSnapshot reads a subscription's buckets and workers as
// [Store.Snapshot] does, for an observer — the CLI, the console — that
// must not join the pool: a Store is one of the pool's workers from [New]
// on, and every worker changes the others' fair share. It writes nothing.
func ReadSnapshot(ctx context.Context, pool *pgxpool.Pool, schema, subscription string) (Snapshot, error) {
	var snap Snapshot
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			snap, err = ReadSnapshotTx(ctx, tx, schema, subscription)
			return err
		})
	return snap, err
}

// ReadSnapshotTx is [ReadSnapshot] in the caller's transaction, to read
// the leases at the same moment as other tables (make tx repeatable read,
// as [ReadSnapshot] does): eventsource.Store.ProgressTx, say. Its Now is
// the transaction's clock.
func ReadSnapshotTx(ctx context.Context, tx pgx.Tx, schema, subscription string) (Snapshot, error) {
	if err := checkOperatorArgs(schema, subscription); err != nil {
		return Snapshot{}, err
	}
	snap, err := readSnapshot(ctx, tx, renderStatements(schema), subscription)
	if err != nil {
		return Snapshot{}, fmt.Errorf("leasestore: snapshot: %w%s", err, migrateHint(err))
	}
	return snap, nil
}

// SubscriptionLeases is one subscription's lease table in brief.
type SubscriptionLeases struct {
	Subscription string // the subscription's name
	Buckets      int    // N
	Held         int    // buckets with an owner whose lease is unexpired
	LiveWorkers  int    // workers whose row is unexpired
}

// ListSubscriptions lists every subscription with lease rows in schema, by
// name. It writes nothing and joins nothing.
func ListSubscriptions(ctx context.Context, pool *pgxpool.Pool, schema string) ([]SubscriptionLeases, error) {
	return listSubscriptions(ctx, pool, schema)
}

// ListSubscriptionsTx is [ListSubscriptions] in the caller's transaction.
func ListSubscriptionsTx(ctx context.Context, tx pgx.Tx, schema string) ([]SubscriptionLeases, error) {
	return listSubscriptions(ctx, tx, schema)
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func listSubscriptions(ctx context.Context, db querier, schema string) ([]SubscriptionLeases, error) {
	if schema == "" {
		return nil, &kumierr.ConfigError{Field: "leasestore schema", Reason: "is required"}
	}
	rows, _ := db.Query(ctx, renderStatements(schema).get("operator_subscriptions"))
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SubscriptionLeases, error) {
		var s SubscriptionLeases
		err := r.Scan(&s.Subscription, &s.Buckets, &s.Held, &s.LiveWorkers)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("leasestore: list subscriptions: %w%s", err, migrateHint(err))
	}
	return out, nil
}

// BucketCount returns a subscription's N as its lease rows record it, or 0
// when it has none (no worker has started it).
func BucketCount(ctx context.Context, pool *pgxpool.Pool, schema, subscription string) (int, error) {
	if err := checkOperatorArgs(schema, subscription); err != nil {
		return 0, err
	}
	var n int
	if err := pool.QueryRow(ctx, renderStatements(schema).get("operator_bucket_count"), subscription).Scan(&n); err != nil {
		return 0, fmt.Errorf("leasestore: bucket count: %w%s", err, migrateHint(err))
	}
	return n, nil
}

// checkOperatorArgs refuses what an operator's read cannot use: no schema
// (a *kumierr.ConfigError), a subscription that is not a valid name (an
// *eventsource.NameError).
func checkOperatorArgs(schema, subscription string) error {
	if schema == "" {
		return &kumierr.ConfigError{Field: "leasestore schema", Reason: "is required"}
	}
	return eventsource.ValidateSubscription(subscription)
}

// readSnapshot reads a subscription's buckets and workers in tx, which
// should be repeatable read for the two to agree.
func readSnapshot(ctx context.Context, tx pgx.Tx, st statements, subscription string) (Snapshot, error) {
	snap := Snapshot{Subscription: subscription}
	rows, _ := tx.Query(ctx, st.get("snapshot_buckets"), subscription)
	var err error
	snap.Buckets, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (BucketState, error) {
		var b BucketState
		var granted, expires, heartbeat, claimed *time.Time
		err := r.Scan(&b.Slot, &b.BucketCount, &b.Owner, &b.Epoch, &granted, &expires, &heartbeat,
			&b.ClaimWorker, &claimed, &snap.Now, &b.Generation, &b.Proposal, &b.Drained)
		b.Bucket = b.Slot % eventsource.MaxGroupSize
		b.GrantedAt, b.Expires, b.Heartbeat, b.ClaimedAt = orZero(granted), orZero(expires),
			orZero(heartbeat), orZero(claimed)
		return b, err
	})
	if err != nil {
		return Snapshot{}, err
	}
	rows, _ = tx.Query(ctx, st.get("snapshot_workers"), subscription)
	snap.Workers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkerState, error) {
		var w WorkerState
		var kind string
		err := r.Scan(&w.Worker, &kind, &w.Joined, &w.Heartbeat, &w.Expires, &w.Live, &w.BackendPID,
			&w.SessionGone, &w.Protocol)
		if kind == KindSession.String() {
			w.Kind = KindSession
		}
		return w, err
	})
	if err != nil {
		return Snapshot{}, err
	}
	if snap.Now.IsZero() {
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&snap.Now); err != nil {
			return Snapshot{}, err
		}
	}
	return snap, nil
}

func orZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
