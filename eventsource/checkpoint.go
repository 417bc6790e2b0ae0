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

// ErrCheckpointAboveHead is wrapped by [*CheckpointAboveHeadError].
var ErrCheckpointAboveHead = errors.New("kumi: checkpoint above the store's head")

// CheckpointAboveHeadError reports a checkpoint write refused because its
// position is above the store's head: a position this server never handed
// out, most likely one read before a failover to a standby that lacked the
// old primary's last commits (see [Store.Server]). Nothing was written: a
// checkpoint there would skip the events that get those positions now.
// The writer should drop what it read and restart from the stored
// checkpoint. It is transient for supervision (a restart mends it).
type CheckpointAboveHeadError struct {
	Subscription string
	Bucket       int
	// Position is the refused position, Head the store's head as the
	// write's statement saw it.
	Position, Head int64
}

// Error says what was refused and why.
func (e *CheckpointAboveHeadError) Error() string {
	return fmt.Sprintf("kumi: checkpoint %d of subscription %q bucket %d refused: above the store's head %d "+
		"(positions from another server, after a failover?); nothing was written, restart from the stored checkpoint",
		e.Position, e.Subscription, e.Bucket, e.Head)
}

// Unwrap returns [ErrCheckpointAboveHead].
func (e *CheckpointAboveHeadError) Unwrap() error { return ErrCheckpointAboveHead }

// TransientError marks the error as transient (see supervision's
// classifier): the writer restarts from its stored checkpoint.
func (e *CheckpointAboveHeadError) TransientError() bool { return true }

// writeCheckpoint runs checkpointSave on tx and returns the stored
// position, or a [*CheckpointAboveHeadError] when position is above the
// head.
func (s *Store) writeCheckpoint(ctx context.Context, tx pgx.Tx, subscription string, bucket int, position int64) (int64, error) {
	var stored *int64
	var head int64
	if err := tx.QueryRow(ctx, s.sql.checkpointSave, subscription, bucket, position).Scan(&stored, &head); err != nil {
		return 0, fmt.Errorf("kumi: save checkpoint: %w", err)
	}
	if stored == nil {
		return 0, &CheckpointAboveHeadError{Subscription: subscription, Bucket: bucket, Position: position, Head: head}
	}
	return *stored, nil
}

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
// (wrapping [ErrFenceLost]) is returned. A position above the store's head
// is refused in the same statement as the write, with a
// [*CheckpointAboveHeadError]. It returns the stored position. A nil
// fence writes unfenced.
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
	return s.writeCheckpoint(ctx, tx, subscription, bucket, position)
}

// ResetCheckpoint sets (subscription, bucket)'s checkpoint to position,
// backwards included: an operator's tool (replay from an earlier point).
// Workers never call it. Use a fence to make sure no live owner races it.
// Unlike [Store.SaveCheckpoint] it writes a position above the store's
// head too (`kumi checkpoints reset --beyond-head`): an operator's choice.
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
