package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

// A reader's part in a resize (docs/resize.md). A reader of the serving
// generation's bucket learns of a resize from its coordinator (after a
// pass) or from its lease at its start. While the resize is sealing and
// its lease carries no bound, it freezes at its cursor — it delivers
// nothing beyond the events already read — and proposes a bound
// (leasestore.Store.ProposeCut); from then on it delivers nothing beyond
// its bound: its proposal, then the cut C once decided. Once C is decided
// it reads its bucket through C, finishes every event up to C (retries
// included: they run to an ack or a dead letter), and drains: its
// checkpoint at C and the drained mark in one fenced transaction
// (leasestore.Store.DrainTx), after which it stops and the slot is
// released for good. A cancelled resize lifts the bound. Events beyond the
// bound stay in the pending list, never delivered by this generation.

// Messages of a resize.
type (
	// resizeBound tells a reader what its coordinator's pass found about
	// its slot: the bound its lease carries, or that the resize is sealing
	// and the lease carries none (seal: propose one).
	resizeBound struct {
		bound leasestore.Bound
		seal  bool
	}
	// proposed is ProposeCut's answer.
	proposed struct {
		gen   *reader
		bound leasestore.Bound
		err   error
	}
	// proposeAgain and drainAgain retry a proposal or a drain that failed
	// on a transient error.
	proposeAgain struct{ gen *reader }
	drainAgain   struct{ gen *reader }
	// cutDrained is DrainTx's answer.
	cutDrained struct {
		gen *reader
		cut int64
		err error
	}
	// readerCutDrained tells the coordinator that the reader drained its
	// old-generation slot to the cut: the slot is released for good.
	readerCutDrained struct {
		Bucket   int   // the slot
		Epoch    int64 // the holding that drained it
		Position int64
	}
)

// beyondBound reports whether the event at pos lies beyond the reader's
// resize bound: it may not be delivered by this generation (yet).
func (r *reader) beyondBound(pos int64) bool { return r.bound.Resizing && pos > r.bound.Limit }

// onResizeBound acts on the coordinator's news of the resize.
func (r *reader) onResizeBound(ctx actor.Context, m *resizeBound) {
	switch {
	case m.seal && !r.bound.Resizing && !r.proposing:
		r.propose(ctx)
	case m.bound.Resizing || !m.seal:
		r.setBound(ctx, m.bound)
	}
}

// propose freezes the reader at its cursor and proposes a bound.
func (r *reader) propose(ctx actor.Context) {
	if r.stopped {
		return
	}
	r.proposing = true
	r.bound = leasestore.Bound{Resizing: true, Limit: r.cursor} // the freeze
	cursor, slot, epoch := r.cursor, r.bucket, r.epoch
	r.async(ctx, func(c context.Context) any {
		b, err := r.g.leases.ProposeCut(c, slot, epoch, cursor)
		return &proposed{gen: r, bound: b, err: err}
	})
}

func (r *reader) onProposed(ctx actor.Context, m *proposed) {
	r.proposing = false
	if m.err != nil {
		if errors.Is(m.err, eventsource.ErrFenceLost) {
			r.lostFence(ctx, m.err)
			return
		}
		err := fmt.Errorf("kumi: bucket %d: propose a cut: %w", r.bucket, m.err)
		if r.retryInPlace(ctx, err, &proposeAgain{gen: r}) {
			r.proposing = true // still frozen: proposeAgain proposes again
			return
		}
		panic(err)
	}
	r.storeFailures = 0
	r.g.logger.Info("kumi: resize: bound proposed", "slot", r.bucket, "generation", r.generation,
		"bucket", r.genBucket, "epoch", r.epoch, "bound", m.bound.Limit, "cut", m.bound.Decided, "resizing", m.bound.Resizing)
	r.bound = leasestore.Bound{} // the freeze ends with the answer
	r.setBound(ctx, m.bound)
	if r.toldSet {
		// What the coordinator told meanwhile is as new as the answer or
		// newer — the cut another proposal decided after this one
		// committed, or a cancel — and it tells a change once.
		told := r.told
		r.told, r.toldSet = leasestore.Bound{}, false
		r.setBound(ctx, told)
	}
	if r.ready && !r.stopped {
		// The freeze is over: what it held back goes now. (setBound pumps
		// when a bound changes, not when it finds none to lift — the
		// answer of a resize cancelled meanwhile.)
		r.pump(ctx)
	}
}

// setBound takes a bound: a proposal, the cut, or none (cancelled). A
// decided cut is never replaced by a proposal. While a proposal is out,
// the bound waits for its answer, and is taken after it (see onProposed).
func (r *reader) setBound(ctx actor.Context, b leasestore.Bound) {
	if r.stopped {
		return
	}
	if r.proposing {
		r.told, r.toldSet = b, true
		return
	}
	switch {
	case !b.Resizing:
		if !r.bound.Resizing {
			return
		}
		r.g.logger.Info("kumi: resize cancelled: the bucket delivers on", "slot", r.bucket, "bound", r.bound.Limit)
		r.bound = leasestore.Bound{}
		if r.ready && !r.catching {
			// Live batches beyond the bound may have been held back or
			// dropped while pending was full: read from the cursor again.
			r.catchUp(ctx, r.target)
		}
	case r.bound.Decided && !b.Decided:
		return
	case b.Decided:
		r.bound = b
		// Everything of the bucket up to C must be read: C may be above
		// what the live batches brought so far.
		r.target = max(r.target, b.Limit)
		if r.ready && !r.catching && r.cursor < b.Limit {
			r.catchUp(ctx, b.Limit)
		}
	default:
		r.bound.Resizing, r.bound.Limit = true, max(r.bound.Limit, b.Limit)
	}
	if r.ready {
		// Not before the checkpoint is loaded: pump reads while catching
		// up, and a read from the cursor's zero value would queue events
		// the checkpoint covers.
		r.pump(ctx)
	}
}

// maybeDrainToCut drains the slot once the cut is decided, the bucket is
// read through it and every event up to it is finished.
func (r *reader) maybeDrainToCut(ctx actor.Context) {
	c := r.bound.Limit
	if !r.bound.Decided || r.cutDraining || r.stopped || r.draining || !r.ready || r.cursor < c ||
		len(r.win.slots) > 0 || (len(r.pending) > 0 && r.pending[0].Position <= c) {
		return
	}
	r.cutDraining = true
	slot, epoch := r.bucket, r.epoch
	r.async(ctx, func(c2 context.Context) any {
		err := pgx.BeginFunc(c2, r.g.store.Pool(), func(tx pgx.Tx) error {
			return r.g.leases.DrainTx(c2, tx, slot, epoch, c)
		})
		return &cutDrained{gen: r, cut: c, err: err}
	})
}

func (r *reader) onCutDrained(ctx actor.Context, m *cutDrained) {
	r.cutDraining = false
	switch {
	case m.err == nil:
		r.storeFailures = 0
		r.acked, r.flushed = max(r.acked, m.cut), max(r.flushed, m.cut)
		r.g.logger.Info("kumi: resize: bucket drained to the cut", "slot", r.bucket, "generation", r.generation,
			"bucket", r.genBucket, "epoch", r.epoch, "cut", m.cut)
		ctx.Send(ctx.Parent(), &readerCutDrained{Bucket: r.bucket, Epoch: r.epoch, Position: m.cut})
		r.shutdown(ctx)
		ctx.Stop(ctx.Self())
	case errors.Is(m.err, leasestore.ErrNoResize):
		r.setBound(ctx, leasestore.Bound{}) // cancelled meanwhile
	case errors.Is(m.err, eventsource.ErrFenceLost):
		r.lostFence(ctx, m.err)
	default:
		err := fmt.Errorf("kumi: bucket %d: drain to the cut: %w", r.bucket, m.err)
		if r.retryInPlace(ctx, err, &drainAgain{gen: r}) {
			r.cutDraining = true // drainAgain drains again
			return
		}
		panic(err)
	}
}

// resizeOf is what the reader of a held slot is to know of the resize:
// for a bucket of the serving generation while a resize runs, the bound
// its lease row carried, or, while sealing without one, that it must
// propose; nothing otherwise (no resize, or a next generation's bucket).
func (c *coordinator) resizeOf(l leasestore.Lease) resizeBound {
	if !c.resize.Resizing() || l.Generation != c.resize.Generation {
		return resizeBound{}
	}
	if c.resize.CutDecided && !l.Bound.Decided {
		// Decided: every holding may deliver up to C, and no further.
		return resizeBound{bound: leasestore.Bound{Resizing: true, Limit: c.resize.Cut, Decided: true}}
	}
	return resizeBound{bound: l.Bound, seal: c.resize.State == leasestore.ResizeSealing && !l.Bound.Resizing}
}

// noteResize records the resize a pass read, and logs its changes.
func (c *coordinator) noteResize(r leasestore.Resize) {
	prev := c.resize
	c.resize = r
	c.g.setResize(r)
	if prev.State != r.State || prev.Generation != r.Generation {
		c.g.logger.Info("kumi: resize state", "generation", r.Generation, "buckets", r.Buckets, "state", r.State,
			"next_buckets", r.NextBuckets, "cut", r.Cut, "cut_decided", r.CutDecided)
	}
}

// onCutDrained forgets a slot its reader drained to the cut: the drain
// released it for good.
func (c *coordinator) onCutDrained(ctx actor.Context, m *readerCutDrained) {
	c.g.setProgress(m.Bucket, m.Position)
	c.drained[m.Bucket] = m.Epoch
	if l, ok := c.owned[m.Bucket]; ok && l.Epoch == m.Epoch {
		// (A pass after a cancel may already have claimed the slot again,
		// at a new epoch: that holding stays.)
		c.g.telemetry.ownership(context.Background(), observability.ChangeRelease, m.Bucket, l.Epoch, "",
			"drained to the resize's cut", "", nil)
		delete(c.owned, m.Bucket)
		delete(c.handoff, m.Bucket)
		c.g.setOwned(c.owned, c.handoff)
	}
	c.pass(ctx) // the drain may have switched or completed the resize
}
