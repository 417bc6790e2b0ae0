package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/readfeed"
	"github.com/kumi-run/kumi/internal/resizepart"
	"github.com/kumi-run/kumi/leasestore"
)

// A reader's part in a resize (docs/design/resize.md). A reader of the serving
// generation's bucket learns of a resize from its coordinator, which tells
// it the whole desired state of its slot on every pass (resizeTold), and
// at its start from what its coordinator last told. While the resize is
// sealing and its lease carries no bound, it freezes at its cursor — it
// delivers nothing beyond the events already read — and proposes a bound
// for that resize (leasestore.Store.ProposeCutFor); from then on it
// delivers nothing beyond its bound: its proposal, then the cut C once
// decided. Once C is decided it reads its bucket through C, finishes every
// event up to C (retries included: they run to an ack or a dead letter),
// and drains: its checkpoint at C and the drained mark in one fenced
// transaction (leasestore.Store.DrainCutTx), after which it stops and the
// slot is released for good. A cancelled resize lifts the bound. Events
// beyond the bound stay in the pending list, never delivered by this
// generation.
//
// What to do when is decided by the pure state machine resizepart.Part
// (internal/resizepart): the reader feeds it what it is told, the answers
// of its proposal and drain, and how far it has finished, and carries out
// the effects it returns. Everything names its resize by id, so a stale
// answer is recognised by identity, not by the order it arrives in.

// Messages of a resize.
type (
	// resizeTold is what the coordinator tells a reader of its slot's
	// resize, on every pass and whenever it changes: the whole desired
	// state (see resizepart.Told), for the holding at epoch. The reader
	// converges to it; telling it again changes nothing.
	resizeTold struct {
		epoch int64
		told  resizepart.Told
	}
	// proposed is ProposeCutFor's answer.
	proposed struct {
		inc   *reader
		bound leasestore.Bound
		err   error
	}
	// proposeAgain and drainAgain retry a proposal or a drain that failed
	// on a transient error.
	proposeAgain struct{ inc *reader }
	drainAgain   struct{ inc *reader }
	// cutDrained is DrainCutTx's answer.
	cutDrained struct {
		inc *reader
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
func (r *reader) beyondBound(pos int64) bool { return r.part.Beyond(pos) || r.releaseHolds(pos) }

// onResizeTold takes the coordinator's desired state of the slot's resize.
func (r *reader) onResizeTold(ctx actor.Context, m *resizeTold) {
	if m.epoch != r.epoch || r.stopped {
		return // a message for another holding of the slot
	}
	r.apply(ctx, r.part.Tell(m.told, r.feed.Cursor()))
}

// apply carries out the effects of the reader's resize part
// (internal/resizepart).
func (r *reader) apply(ctx actor.Context, effects []resizepart.Effect) {
	for _, e := range effects {
		switch e.Kind {
		case resizepart.Propose:
			r.propose(ctx, e.Resize, e.Position)
		case resizepart.Drain:
			r.drainToCut(ctx, e.Resize, e.Position)
		case resizepart.Done:
			r.cp.Cut(e.Position)
			r.g.logger.Info("kumi: resize: bucket drained to the cut", "slot", r.bucket, "generation", r.generation,
				"bucket", r.genBucket, "epoch", r.epoch, "resize", e.Resize, "cut", e.Position)
			ctx.Send(ctx.Parent(), &readerCutDrained{Bucket: r.bucket, Epoch: r.epoch, Position: e.Position})
			r.shutdown(ctx)
			ctx.Stop(ctx.Self())
			return
		case resizepart.BoundChanged:
			r.onBoundChanged(ctx)
		}
	}
}

// onBoundChanged acts on a new resize bound: a decided cut is read
// through, a lifted bound reads again from the cursor, and what the bound
// now lets through is delivered.
func (r *reader) onBoundChanged(ctx actor.Context) {
	if r.stopped {
		return
	}
	b := r.part.Bound()
	r.g.logger.Debug("kumi: resize bound", "slot", r.bucket, "epoch", r.epoch, "phase", r.part.Phase().String(),
		"bounded", b.Bounded, "bound", b.Limit, "cut", b.Decided, "resize", b.Resize)
	// A decided cut is read through (C may be above what the live batches
	// brought so far), and no page past it; a lifted bound reads again
	// from the cursor (see readfeed.Feed.Bound).
	r.feedDo(ctx, r.feed.Bound(readfeed.Bound{Bounded: b.Bounded, Decided: b.Decided, Limit: b.Limit}, r.feedEnv()))
	if r.loaded() {
		r.pump(ctx) // what the bound now lets through is delivered
	}
}

// propose proposes a bound for resize at cursor, where the reader is
// frozen (ProposeCutFor: a proposal that outlives its resize is refused,
// not counted for the next one).
func (r *reader) propose(ctx actor.Context, resize, cursor int64) {
	if r.stopped {
		return
	}
	slot, epoch := r.bucket, r.epoch
	r.async(ctx, func(c context.Context) any {
		b, err := r.g.leases.ProposeCutFor(c, slot, epoch, resize, cursor)
		return &proposed{inc: r, bound: b, err: err}
	})
}

func (r *reader) onProposed(ctx actor.Context, m *proposed) {
	if m.err != nil {
		if errors.Is(m.err, eventsource.ErrFenceLost) {
			r.lostFence(ctx, m.err)
			return
		}
		err := fmt.Errorf("kumi: bucket %d: propose a cut: %w", r.bucket, m.err)
		if r.retryInPlace(ctx, err, &proposeAgain{inc: r}) {
			return // still frozen: proposeAgain proposes again
		}
		panic(err)
	}
	r.storeFailures = 0
	r.g.logger.Info("kumi: resize: bound proposed", "slot", r.bucket, "generation", r.generation,
		"bucket", r.genBucket, "epoch", r.epoch, "resize", m.bound.Resize, "bound", m.bound.Limit, "cut", m.bound.Decided,
		"resizing", m.bound.Resizing)
	r.apply(ctx, r.part.Proposal(resizepart.Answer{Resize: m.bound.Resize, Active: m.bound.Resizing,
		Limit: m.bound.Limit, Decided: m.bound.Decided}, r.feed.Cursor()))
}

// maybeDrainToCut tells the resize part how far the reader has finished:
// once the cut is decided, the bucket read through it and every event up
// to it finished, it drains.
func (r *reader) maybeDrainToCut(ctx actor.Context) {
	if r.part.Phase() != resizepart.Cut || r.stopped || !r.loaded() {
		return
	}
	finished, pending := r.feed.Cursor(), r.feed.Pending()
	switch {
	case len(r.ws.held) > 0:
		finished = min(finished, r.ws.held[0].Position-1)
	case len(pending) > 0:
		finished = min(finished, pending[0].Position-1)
	}
	r.apply(ctx, r.part.Progress(finished, !r.draining))
}

// drainToCut writes the drain to the cut of resize: the checkpoint at cut
// and the drained mark, fenced (DrainCutTx).
func (r *reader) drainToCut(ctx actor.Context, resize, cut int64) {
	if r.stopped {
		return
	}
	slot, epoch := r.bucket, r.epoch
	b := leasestore.Bound{Resize: resize, Resizing: true, Limit: cut, Decided: true}
	r.async(ctx, func(c context.Context) any {
		err := pgx.BeginFunc(c, r.g.store.Pool(), func(tx pgx.Tx) error {
			return r.g.leases.DrainCutTx(c, tx, slot, epoch, b)
		})
		return &cutDrained{inc: r, err: err}
	})
}

func (r *reader) onCutDrained(ctx actor.Context, m *cutDrained) {
	switch {
	case m.err == nil:
		r.storeFailures = 0
		r.apply(ctx, r.part.DrainDone())
	case errors.Is(m.err, leasestore.ErrNoResize):
		r.g.logger.Info("kumi: resize: the drain's resize is over: the bucket delivers on", "slot", r.bucket,
			"epoch", r.epoch, "err", m.err)
		r.apply(ctx, r.part.DrainRefused(r.feed.Cursor())) // cancelled meanwhile
	case errors.Is(m.err, eventsource.ErrFenceLost):
		r.lostFence(ctx, m.err)
	default:
		err := fmt.Errorf("kumi: bucket %d: drain to the cut: %w", r.bucket, m.err)
		if r.retryInPlace(ctx, err, &drainAgain{inc: r}) {
			return // drainAgain drains again
		}
		panic(err)
	}
}
