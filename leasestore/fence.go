package leasestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
)

// Fence returns the fence of this worker's holding of bucket at epoch (the
// Epoch of a [Lease]), for the event store's fenced checkpoint writes: its
// Check is [Store.Guard].
func (s *Store) Fence(bucket int, epoch int64) eventsource.Fence {
	return eventsource.FenceFunc(func(ctx context.Context, tx pgx.Tx) error {
		return s.Guard(ctx, tx, bucket, epoch)
	})
}

// Guard checks, inside the caller's write transaction and before its write,
// that this worker still owns bucket at epoch. It locks the lease row FOR
// SHARE until tx ends, so no change of owner can commit between the check
// and the write: a takeover either committed before (and Guard fails) or
// waits for tx (and the new owner reads what tx wrote).
//
// Guard checks the owner and the epoch, not the expiry. The epoch grows on
// every change of owner, so a lapsed lease that nobody has taken still
// guards a correct write, and one somebody took fails whatever the clocks
// say. On failure it returns a *[LostFenceError] wrapping
// [eventsource.ErrFenceLost], and marks the bucket lost in the view, so
// EnsureHeld fails and the next Pass reports it in Lost.
//
// A transaction guarding several buckets should guard them in ascending
// bucket order, the order in which a pass locks them.
func (s *Store) Guard(ctx context.Context, tx pgx.Tx, bucket int, epoch int64) error {
	return s.guardWith(ctx, tx, "guard", bucket, epoch)
}

// guardResize is Guard for a resize's write to the slot's own lease row
// (a proposal, a drain): it locks the row FOR UPDATE rather than FOR SHARE.
func (s *Store) guardResize(ctx context.Context, tx pgx.Tx, slot int, epoch int64) error {
	return s.guardWith(ctx, tx, "resize_guard", slot, epoch)
}

func (s *Store) guardWith(ctx context.Context, tx pgx.Tx, statement string, bucket int, epoch int64) error {
	if err := s.boundLocks(ctx, tx); err != nil {
		return fmt.Errorf("leasestore: guard bucket %d: %w", bucket, err)
	}
	var owner string
	var found int64
	err := tx.QueryRow(ctx, s.st.get(statement), s.cfg.Subscription, bucket).Scan(&owner, &found)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		owner, found = "", -1
	case err != nil:
		return fmt.Errorf("leasestore: guard bucket %d: %w", bucket, err)
	case owner == s.cfg.Worker && found == epoch:
		return nil
	}
	s.viewMu.Lock()
	if h, ok := s.view[bucket]; ok && h.epoch == epoch {
		h.fenced = true
		s.view[bucket] = h
	}
	s.viewMu.Unlock()
	s.log.Info("lease fence lost", "bucket", bucket, "epoch", epoch, "owner", owner, "found_epoch", found)
	return &LostFenceError{Subscription: s.cfg.Subscription, Bucket: bucket, Worker: s.cfg.Worker,
		Epoch: epoch, Owner: owner, FoundEpoch: found}
}

// boundLocks makes PostgreSQL end tx's session if it sits idle inside the
// transaction for a TTL: a worker frozen (SIGSTOP, a long pause, a network
// blackhole) while it holds lease-row locks would otherwise keep every
// other worker's FOR UPDATE SKIP LOCKED claim off those rows until it
// wakes, long after its lease expired. SET LOCAL scope: it ends with tx,
// so it is safe through a transaction pooler.
func (s *Store) boundLocks(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, boundLocksSQL, s.boundLocksArg())
	return err
}

const boundLocksSQL = "SELECT set_config('idle_in_transaction_session_timeout', $1, true)"

func (s *Store) boundLocksArg() string { return fmt.Sprintf("%dms", max(s.cfg.TTL.Milliseconds(), 1)) }
