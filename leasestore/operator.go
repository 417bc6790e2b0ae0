package leasestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// FencedOut is what [FenceOut] found and did to one bucket's lease.
type FencedOut struct {
	// Found reports that the bucket has a lease row; without one no worker
	// has ever held it, and nothing was changed.
	Found bool
	// Owner is the owner the row named ("" when free); it stays the owner.
	Owner string
	// Live reports that Owner's lease was unexpired (FenceOut was forced).
	Live bool
	// Epoch is the bucket's epoch now: every holding granted before it is
	// fenced out.
	Epoch int64
}

// HeldError is returned by [FenceOut] without force when a live owner
// holds the bucket: nothing was changed.
type HeldError struct {
	Subscription string        // the lease's subscription
	Bucket       int           // the bucket
	Owner        string        // its live owner
	Epoch        int64         // the owner's epoch
	ExpiresIn    time.Duration // how long its lease has left (database clock)
}

// Error names the owner and what to do.
func (e *HeldError) Error() string {
	return fmt.Sprintf("leasestore: subscription %q bucket %d is held by %s (epoch %d, lease expires in %v): "+
		"stop the subscription's workers (or wait until none holds it) and retry, or force it",
		e.Subscription, e.Bucket, e.Owner, e.Epoch, e.ExpiresIn.Round(time.Millisecond))
}

// FenceOut is the operator's fence, for a write that an earlier holder of
// bucket must not undo — a checkpoint reset above all. Inside the caller's
// transaction, before its write, it locks the bucket's lease row FOR
// UPDATE (waiting for a pass or a fenced write in flight; set lock_timeout
// in tx to bound the wait) and increments the epoch, so that every holding
// granted before it fails its fence: a lapsed owner that comes back, or a
// live one when forced, cannot write the checkpoint from its in-memory
// cursor. The owner, the expiry and any pending claim stay as they are;
// the owner's next pass finds its bucket at a new epoch, reports it in
// Lost and in Claimed, and its reader restarts from the stored checkpoint
// — the operator's. The workers are notified at once (on commit).
//
// Without force a bucket whose owner's lease is unexpired is refused with a
// *[HeldError] and nothing changes. A lapsed lease is not refused: it is
// exactly the case whose owner may come back and renew at the same epoch.
// A missing lease row (no worker ever started) is not an error: Found is
// false and nothing changes.
func FenceOut(ctx context.Context, tx pgx.Tx, schema, subscription string, bucket int, force bool) (FencedOut, error) {
	if schema == "" {
		return FencedOut{}, &ConfigError{Field: "Schema", Reason: "is required"}
	}
	st := renderStatements(schema)
	var out FencedOut
	var left *time.Duration
	err := tx.QueryRow(ctx, st.get("operator_lock"), subscription, bucket).Scan(&out.Owner, &out.Epoch, &left)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return FencedOut{}, nil
	case err != nil:
		return FencedOut{}, fmt.Errorf("leasestore: fence out bucket %d: %w%s", bucket, err, migrateHint(err))
	}
	out.Found = true
	out.Live = out.Owner != "" && left != nil
	if out.Live && !force {
		return out, &HeldError{Subscription: subscription, Bucket: bucket, Owner: out.Owner, Epoch: out.Epoch,
			ExpiresIn: *left}
	}
	b := &pgx.Batch{}
	b.Queue(st.get("operator_bump"), subscription, bucket).QueryRow(func(r pgx.Row) error { return r.Scan(&out.Epoch) })
	b.Queue(st.get("notify"), ChannelName(schema, subscription), "fence:kumi-operator")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return FencedOut{}, fmt.Errorf("leasestore: fence out bucket %d: %w", bucket, err)
	}
	return out, nil
}
