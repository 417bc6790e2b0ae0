package eventsource

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ErrFenceLost reports that a fenced write did not land because the writer
// no longer holds what the fence guards (for a checkpoint: the bucket at the
// epoch it was granted). A worker that sees it must stop working on the
// bucket at once. Test with errors.Is; lease stores wrap it with detail.
var ErrFenceLost = errors.New("kumi: fence lost")

// Fence is the seam through which a lease store gates the event store's
// writes. Check runs inside the write's transaction, before the write, and
// returns an error wrapping [ErrFenceLost] when the write must not land. It
// should lock what it checks (FOR SHARE or FOR UPDATE) so that no change of
// ownership can commit between the check and the write.
//
// leasestore's fences check (subscription, bucket, owner, epoch) against the
// lease row.
type Fence interface {
	Check(ctx context.Context, tx pgx.Tx) error
}

// FenceFunc adapts a function to [Fence].
type FenceFunc func(ctx context.Context, tx pgx.Tx) error

// Check calls f.
func (f FenceFunc) Check(ctx context.Context, tx pgx.Tx) error { return f(ctx, tx) }
