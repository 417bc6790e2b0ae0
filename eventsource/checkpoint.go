package eventsource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Checkpoint is a subscription's progress in one bucket: the global
// position of the last event it handled.
type Checkpoint struct {
	Bucket    int       // the consumer-group bucket
	Position  int64     // the last handled global position
	UpdatedAt time.Time // when it was last written
}

// ErrInvalidCheckpoint reports a negative bucket or position.
var ErrInvalidCheckpoint = errors.New("kumi: invalid checkpoint")

func checkCheckpoint(subscription string, bucket int, position int64) error {
	if err := ValidateSubscription(subscription); err != nil {
		return err
	}
	if bucket < 0 || position < 0 {
		return fmt.Errorf("%w: bucket %d, position %d (both must be >= 0)", ErrInvalidCheckpoint, bucket, position)
	}
	return nil
}

// Checkpoint returns the position stored for (subscription, bucket), 0 if
// none.
func (s *Store) Checkpoint(ctx context.Context, subscription string, bucket int) (int64, error) {
	if err := checkCheckpoint(subscription, bucket, 0); err != nil {
		return 0, err
	}
	var p int64
	err := s.pool.QueryRow(ctx, s.sql.checkpointGet, subscription, bucket).Scan(&p)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return p, err
}

// Checkpoints lists the stored checkpoints of a subscription by bucket.
func (s *Store) Checkpoints(ctx context.Context, subscription string) ([]Checkpoint, error) {
	if err := ValidateSubscription(subscription); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.sql.checkpointList, subscription)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Checkpoint, error) {
		var c Checkpoint
		err := r.Scan(&c.Bucket, &c.Position, &c.UpdatedAt)
		return c, err
	})
}

// SaveCheckpoint moves (subscription, bucket)'s checkpoint forward to
// position, in a transaction of its own in which fence is checked first. A
// checkpoint never moves backwards (GREATEST): a lower position changes
// nothing. When fence refuses, nothing is written and the fence's error
// (wrapping [ErrFenceLost]) is returned. It returns the stored position. A
// nil fence writes unfenced.
func (s *Store) SaveCheckpoint(ctx context.Context, subscription string, bucket int, position int64, fence Fence) (int64, error) {
	var stored int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		stored, err = s.SaveCheckpointTx(ctx, tx, subscription, bucket, position, fence)
		return err
	})
	return stored, err
}

// SaveCheckpointTx is [Store.SaveCheckpoint] inside the caller's
// transaction, so that a handler can commit its own writes and the
// checkpoint together: exactly-once for projections in the same database.
func (s *Store) SaveCheckpointTx(ctx context.Context, tx pgx.Tx, subscription string, bucket int, position int64, fence Fence) (int64, error) {
	if err := checkCheckpoint(subscription, bucket, position); err != nil {
		return 0, err
	}
	if fence != nil {
		if err := fence.Check(ctx, tx); err != nil {
			return 0, err
		}
	}
	var stored int64
	if err := tx.QueryRow(ctx, s.sql.checkpointSave, subscription, bucket, position).Scan(&stored); err != nil {
		return 0, fmt.Errorf("kumi: save checkpoint: %w", err)
	}
	return stored, nil
}

// ResetCheckpoint sets (subscription, bucket)'s checkpoint to position,
// backwards included: an operator's tool (replay from an earlier point).
// Workers never call it. Use a fence to make sure no live owner races it.
func (s *Store) ResetCheckpoint(ctx context.Context, subscription string, bucket int, position int64, fence Fence) error {
	if err := checkCheckpoint(subscription, bucket, position); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if fence != nil {
			if err := fence.Check(ctx, tx); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, s.sql.checkpointReset, subscription, bucket, position)
		return err
	})
}

// LockCheckpointTx locks (subscription, bucket)'s checkpoint row until the
// end of tx, creating it at 0 if missing, and returns its position. A
// concurrent holder of the lock makes it wait, then see that holder's
// committed position: two attempts to commit the same event with its
// checkpoint (actors.CommitWithCheckpoint) run one after the other, and
// the second sees the first's checkpoint.
func (s *Store) LockCheckpointTx(ctx context.Context, tx pgx.Tx, subscription string, bucket int) (int64, error) {
	if err := checkCheckpoint(subscription, bucket, 0); err != nil {
		return 0, err
	}
	var p int64
	if err := tx.QueryRow(ctx, s.sql.checkpointLock, subscription, bucket).Scan(&p); err != nil {
		return 0, fmt.Errorf("kumi: lock checkpoint: %w", err)
	}
	return p, nil
}
