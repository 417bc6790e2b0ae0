package leasestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// HandOver gives up bucket after its reader has drained (see
// [PassResult.HandOff]): the pending claimant activates it on its next pass,
// woken by a notification. The bucket leaves the view first, so EnsureHeld
// fails for it from the moment HandOver is called. Handing over a bucket
// that is no longer held is a no-op. Without a pending claim the bucket is
// simply released.
func (s *Store) HandOver(ctx context.Context, bucket int) error {
	if err := s.running(); err != nil {
		return err
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	gone := s.forget(bucket)
	h, ok := gone[bucket]
	if !ok {
		return nil
	}
	// BEGIN and the statement in one round trip, the notification with
	// the COMMIT in the next (was four round trips: a handoff of each
	// group's buckets to a joiner held the lease pool that long).
	return s.runPipelined(ctx, func(conn *commitTail) error {
		b := &pgx.Batch{}
		b.Queue(beginSQL)
		b.Queue(s.st.get("hand_over"), s.cfg.Subscription, s.cfg.Worker, bucket, h.epoch)
		to, err := beginAndCollect(ctx, conn, b, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("leasestore: hand over bucket %d: %w", bucket, err)
		}
		if len(to) == 0 {
			return nil
		}
		s.log.Info("lease handed over", "bucket", bucket, "epoch", h.epoch, "to", to[0])
		return s.notify(ctx, conn, "handoff")
	})
}

// beginAndCollect sends b — beginSQL and one statement — on conn, and
// collects the statement's rows with scan.
func beginAndCollect[T any](ctx context.Context, conn *commitTail, b *pgx.Batch, scan pgx.RowToFunc[T]) ([]T, error) {
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, _ := br.Query()
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return out, br.Close()
}

// Release gives up buckets at once, so that other workers can claim them on
// their next pass without waiting for expiry (a bucket with a pending claim
// goes to its claimant). Stop the buckets' readers and flush their
// checkpoints first. Buckets not held are ignored.
func (s *Store) Release(ctx context.Context, buckets []int) error {
	if err := s.running(); err != nil {
		return err
	}
	if len(buckets) == 0 {
		return nil
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.forget(buckets...)
	return s.runPipelined(ctx, func(conn *commitTail) error { // two round trips, as HandOver
		b := &pgx.Batch{}
		b.Queue(beginSQL)
		b.Queue(s.st.get("release"), s.cfg.Subscription, s.cfg.Worker, buckets)
		released, err := beginAndCollect(ctx, conn, b, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("leasestore: release: %w", err)
		}
		if len(released) == 0 {
			return nil
		}
		s.log.Info("leases released", "buckets", released)
		return s.notify(ctx, conn, "release")
	})
}

// Leave releases every bucket this worker holds, withdraws its claims and
// deletes its worker row, in one transaction, and notifies the others, who
// rebalance at once. Stop every reader and flush its checkpoint first. A
// later Pass joins again.
func (s *Store) Leave(ctx context.Context) error {
	if err := s.running(); err != nil {
		return err
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.viewMu.Lock()
	s.view = map[int]heldLease{}
	s.viewMu.Unlock()
	// Its two statements lock the rows this worker owns, then those it
	// claimed, each in bucket order; another worker's pass may hold one of
	// the latter, renewed, while it waits for one of the former to withdraw
	// its own claim on it. PostgreSQL breaks such a cycle by failing one
	// side; when it fails the leave, which has changed nothing, the leave is
	// tried again (TestLeaveIsTriedAgainWhenADeadlockFailsIt).
	return onDeadlockAgain(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(s.st.get("release_all"), s.cfg.Subscription, s.cfg.Worker)
			b.Queue(s.st.get("withdraw_all"), s.cfg.Subscription, s.cfg.Worker)
			b.Queue(s.st.get("worker_delete"), s.cfg.Subscription, s.cfg.Worker)
			b.Queue(s.st.get("notify"), s.channel, "leave:"+s.cfg.Worker)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return fmt.Errorf("leasestore: leave: %w", err)
			}
			s.log.Info("left the pool")
			return nil
		})
	})
}

// deadlockAttempts bounds the tries of a transaction that PostgreSQL fails
// to break a deadlock (see onDeadlockAgain).
const deadlockAttempts = 5

// onDeadlockAgain runs tx, a whole transaction, and runs it again, up to
// deadlockAttempts times in all, while PostgreSQL fails it with a deadlock
// (40P01): the failed try changed nothing, and the other side of the cycle
// goes on.
func onDeadlockAgain(ctx context.Context, tx func() error) error {
	for attempt := 1; ; attempt++ {
		err := tx()
		var pgErr *pgconn.PgError
		if attempt == deadlockAttempts || !errors.As(err, &pgErr) || pgErr.Code != "40P01" || ctx.Err() != nil {
			return err
		}
	}
}
