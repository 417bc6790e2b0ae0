package inspect

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/leasestore"
)

// ErrResizeCancelled is returned by [FollowResize] when the resize it
// follows was cancelled before it completed: the subscription keeps its
// bucket count.
var ErrResizeCancelled = errors.New("kumi: the resize was cancelled")

// DefaultResizePoll is how often [FollowResize] reads the resize when no
// interval is given.
const DefaultResizePoll = 100 * time.Millisecond

// FollowResize follows a subscription's resize — r as
// leasestore.RequestResize returned it, or as leasestore.ReadResize read
// it while it ran — reading it every poll (0 means DefaultResizePoll)
// until the next generation serves, and returns it. It calls progress, when
// not nil, with each read that differs from the one before (a state, the
// cut, a bucket's proposal, drain or readiness). A resize cancelled
// meanwhile returns [ErrResizeCancelled] — also when another resize was
// requested after the cancel, before a read saw it: the resize followed is
// the one r names ([leasestore.Resize.ID]), and someone else's completing
// is not its success; ctx ending returns ctx.Err(),
// and the resize goes on: nothing here drives it, the workers do.
func FollowResize(ctx context.Context, pool *pgxpool.Pool, schema string, r leasestore.Resize, poll time.Duration,
	progress func(leasestore.Resize)) (leasestore.Resize, error) {
	if poll <= 0 {
		poll = DefaultResizePoll
	}
	from := r.Generation
	t := time.NewTicker(poll)
	defer t.Stop()
	last := r
	for {
		switch {
		case last.ID != r.ID:
			// Another resize since: the one followed ended between two
			// reads. It completed iff the generation it was to make names
			// it (a cancel deletes that generation's record).
			made, err := leasestore.ResizeMade(ctx, pool, schema, r.Subscription, from+1)
			if err != nil {
				return last, err
			}
			if made != r.ID {
				return last, ErrResizeCancelled
			}
			return leasestore.Resize{Subscription: r.Subscription, ID: r.ID, Generation: from + 1,
				Buckets: r.NextBuckets, State: leasestore.ResizeSteady, RequestedBy: r.RequestedBy,
				RequestedAt: r.RequestedAt}, nil
		case !last.Resizing() && last.Generation > from:
			return last, nil
		case !last.Resizing():
			return last, ErrResizeCancelled
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-t.C:
		}
		now, err := leasestore.ReadResize(ctx, pool, schema, r.Subscription)
		if err != nil {
			if ctx.Err() != nil {
				return last, ctx.Err()
			}
			return last, err
		}
		if r.ID == 0 {
			r.ID = now.ID // a resize given without its id: the one read
		}
		if progress != nil && ResizeChanged(last, now) {
			progress(now)
		}
		last = now
	}
}

// ResizeChanged reports whether a resize moved on between two reads: its
// state, generation or cut, or a bucket's owner, proposal, drain or
// readiness.
func ResizeChanged(a, b leasestore.Resize) bool {
	if a.State != b.State || a.Generation != b.Generation || a.Cut != b.Cut || a.CutDecided != b.CutDecided ||
		len(a.Old) != len(b.Old) || len(a.New) != len(b.New) {
		return true
	}
	for i := range a.Old {
		if a.Old[i] != b.Old[i] {
			return true
		}
	}
	for i := range a.New {
		if a.New[i] != b.New[i] {
			return true
		}
	}
	return false
}

// ResizeCounts are a running resize's progress: the old buckets that have
// proposed and drained, the new ones ready.
type ResizeCounts struct {
	Proposed, Drained, Ready int
}

// CountResize counts a resize's progress.
func CountResize(r leasestore.Resize) ResizeCounts {
	var c ResizeCounts
	for _, s := range r.Old {
		if s.Proposal >= 0 {
			c.Proposed++
		}
		if s.Drained {
			c.Drained++
		}
	}
	for _, s := range r.New {
		if s.Ready {
			c.Ready++
		}
	}
	return c
}
