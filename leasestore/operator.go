package leasestore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
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
// A resize in progress refuses it with a *[ResizeInProgressError] (a
// reset would move a bucket across the cut), and so does a slot of a
// retired generation ([ErrRetiredGeneration]): reset the serving
// generation's buckets.
//
// Without force a bucket whose owner's lease is unexpired is refused with a
// *[HeldError] and nothing changes. A lapsed lease is not refused: it is
// exactly the case whose owner may come back and renew at the same epoch.
// A missing lease row (no worker ever started) is not an error: Found is
// false and nothing changes.
func FenceOut(ctx context.Context, tx pgx.Tx, schema, subscription string, bucket int, force bool) (FencedOut, error) {
	if schema == "" {
		return FencedOut{}, &kumierr.ConfigError{Field: "leasestore schema", Reason: "is required"}
	}
	st := renderStatements(schema)
	if err := resetAllowed(ctx, tx, st, subscription, bucket); err != nil {
		return FencedOut{}, err
	}
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

// OperatorFence is [FenceOut] as an [eventsource.Fence], for an
// operator's checkpoint reset (eventsource.Store.ResetCheckpoint): inside
// the reset's transaction it waits at most 5 s for a pass or a fenced
// write that holds the lease row, then fences out every earlier holder of
// bucket, refusing a live owner with a *[HeldError] unless force. What it
// found and did is stored in *out when the reset's transaction runs.
func OperatorFence(schema, subscription string, bucket int, force bool, out *FencedOut) eventsource.Fence {
	return eventsource.FenceFunc(func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, statements(queries).get("operator_lock_timeout")); err != nil {
			return fmt.Errorf("leasestore: fence out bucket %d: %w", bucket, err)
		}
		var err error
		*out, err = FenceOut(ctx, tx, schema, subscription, bucket, force)
		return err
	})
}

// Why [RequestHandoff] refused: the Reason of its *[HandoffError].
var (
	// ErrNoBuckets: the subscription has no lease rows — no worker has
	// started it, or the name is wrong.
	ErrNoBuckets = errors.New("leasestore: the subscription has no lease rows")
	// ErrBucketOutOfRange: the subscription has no lease row at that slot
	// (for a subscription never resized: the bucket is not in 0..N-1).
	ErrBucketOutOfRange = errors.New("leasestore: no such bucket")
	// ErrBucketFree: the bucket has no owner, so nothing to hand over; a
	// worker below its fair share claims it on its next pass.
	ErrBucketFree = errors.New("leasestore: the bucket has no owner")
	// ErrLeaseExpired: the owner's lease has expired; the next pass of any
	// worker takes the bucket without a handoff.
	ErrLeaseExpired = errors.New("leasestore: the bucket's lease has expired")
	// ErrClaimPending: a claim is pending already; its owner is handing
	// the bucket over.
	ErrClaimPending = errors.New("leasestore: the bucket already has a pending claim")
	// ErrTargetIsOwner: the worker asked for is the bucket's owner.
	ErrTargetIsOwner = errors.New("leasestore: the target is the bucket's owner")
	// ErrTargetNotLive: the worker asked for is not a live worker of the
	// subscription (a claim by anyone else is stale, and cleared).
	ErrTargetNotLive = errors.New("leasestore: the target is not a live worker")
	// ErrNoOtherWorker: the owner is the subscription's only live worker:
	// nobody could take the bucket.
	ErrNoOtherWorker = errors.New("leasestore: no live worker but the owner")
	// ErrHandoffRaced: the owner, the claim or the target's liveness
	// changed between the read and the claim; look again and retry.
	ErrHandoffRaced = errors.New("leasestore: the bucket changed while the claim was placed")
)

// HandoffError is [RequestHandoff]'s refusal: nothing was changed. Test
// its Reason with errors.Is (ErrBucketFree, ErrClaimPending, ...); the
// other fields hold what the refusal was decided on.
type HandoffError struct {
	Reason       error       // one of the Err* refusals above
	Subscription string      // the subscription
	Bucket       int         // the bucket asked for
	Buckets      int         // the subscription's N; 0 with ErrNoBuckets
	To           string      // the target: asked for, or chosen (ErrHandoffRaced)
	Lease        BucketState // the bucket's lease row as read; zero when it has none
	Now          time.Time   // the database's clock when it was read
}

// Error says why, with the owner, claimant and times that matter.
func (e *HandoffError) Error() string {
	l := e.Lease
	var why string
	switch e.Reason {
	case ErrNoBuckets:
		why = "the subscription has no lease rows: no worker has started it"
	case ErrBucketOutOfRange:
		why = fmt.Sprintf("the subscription has buckets 0 to %d", e.Buckets-1)
	case ErrBucketFree:
		why = "no owner: nothing to hand over (a worker below its fair share claims it on its next pass)"
	case ErrLeaseExpired:
		why = fmt.Sprintf("the lease of %s expired %v ago: the next pass of any worker takes it without a handoff",
			l.Owner, e.Now.Sub(l.Expires).Round(time.Millisecond))
	case ErrClaimPending:
		why = fmt.Sprintf("%s has a pending claim on it (placed %v ago): its owner %s is handing it over",
			l.ClaimWorker, e.Now.Sub(l.ClaimedAt).Round(time.Millisecond), l.Owner)
	case ErrTargetIsOwner:
		why = fmt.Sprintf("%s is the bucket's owner", e.To)
	case ErrTargetNotLive:
		why = fmt.Sprintf("%s is not a live worker", e.To)
	case ErrNoOtherWorker:
		why = fmt.Sprintf("%s is the only live worker: nobody could take the bucket", l.Owner)
	default:
		why = fmt.Sprintf("the owner, the claim or %s's liveness changed meanwhile: look again and retry", e.To)
	}
	return fmt.Sprintf("leasestore: request handoff of subscription %q bucket %d refused: %s", e.Subscription, e.Bucket, why)
}

// Unwrap returns the Reason.
func (e *HandoffError) Unwrap() error { return e.Reason }

// HandoffRequest is what [RequestHandoff] placed.
type HandoffRequest struct {
	Owner string // the owner asked to hand the bucket over
	Epoch int64  // its epoch, which the claimant's activation grows by one
	To    string // the claimant: the target asked for, or the one chosen
	// Buckets is the subscription's N, Live its live workers (the owner
	// included) and Load the claimant's load before the claim — the live
	// buckets it owned plus its pending claims — as the target was chosen:
	// against FairShare(Buckets, Live) they tell whether the claim puts the
	// claimant above its share (it may then withdraw it).
	Buckets, Live, Load int
	// Before is the subscription's leases as read to decide, before the
	// claim; judge its times against Before.Now.
	Before Snapshot
}

// RequestHandoff asks the live owner of bucket — a slot,
// eventsource.Slot(generation, bucket), which for a subscription never
// resized is the bucket itself — to hand it over to the live
// member to, or when to is "" to the live member other than the owner with
// the fewest buckets (owned live, plus pending claims; ties by name): it
// places the first phase of the two-phase handoff, a pending claim in the
// target's name — the path a joining worker's claim takes, so nothing is
// delivered twice and nothing skipped. The owner's next pass sees the claim
// (its renewal no longer extends the lease), drains and calls HandOver;
// the claimant activates the bucket at the next epoch on its own pass. The
// workers are notified at once. It is an operator's call (`kumi
// relinquish`, the console): it does not join the pool as a worker.
//
// A claim names a live worker because leasestore treats a claim by anyone
// else as stale and clears it. The fair share still rules: a claimant above
// its share after the claim withdraws it on its next pass if that comes
// before the owner's handover.
//
// It refuses with a *[HandoffError], changing nothing, a subscription
// without lease rows, a bucket out of range, a free or expired bucket, one
// with a pending claim, a target that is the owner or not a live worker,
// and an owner that is the only live worker. The claim is placed with the
// conditions checked again under the row lock (waiting at most 5 s for a
// pass in flight); when they no longer hold, the refusal is
// [ErrHandoffRaced].
func RequestHandoff(ctx context.Context, pool *pgxpool.Pool, schema, subscription string, bucket int, to string) (HandoffRequest, error) {
	if schema == "" {
		return HandoffRequest{}, &kumierr.ConfigError{Field: "leasestore schema", Reason: "is required"}
	}
	st := renderStatements(schema)
	var req HandoffRequest
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, st.get("operator_lock_timeout")); err != nil {
			return err
		}
		snap, err := readSnapshot(ctx, tx, st, subscription)
		if err != nil {
			return err
		}
		req = HandoffRequest{Before: snap}
		if req.To, err = chooseClaimant(snap, bucket, to, &req); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, st.get("operator_request"), subscription, bucket, req.To).Scan(&req.Owner, &req.Epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			return snap.refuse(ErrHandoffRaced, bucket, req.To)
		}
		if err != nil {
			return err
		}
		// Without it the workers see the claim on their next pass.
		_, err = tx.Exec(ctx, st.get("notify"), ChannelName(schema, subscription), "request:kumi-operator")
		return err
	})
	var refused *HandoffError
	switch {
	case errors.As(err, &refused):
		return HandoffRequest{}, err
	case err != nil:
		return HandoffRequest{}, fmt.Errorf("leasestore: request handoff of bucket %d: %w%s", bucket, err, migrateHint(err))
	}
	return req, nil
}

// chooseClaimant applies RequestHandoff's refusals to snap and returns the
// claimant: to, or the least loaded live worker other than the owner. It
// fills req's counts.
func chooseClaimant(snap Snapshot, bucket int, to string, req *HandoffRequest) (string, error) {
	n := 0
	for _, b := range snap.Buckets {
		n = max(n, b.BucketCount)
	}
	row, found := snap.bucket(bucket)
	switch {
	case n == 0:
		return "", snap.refuse(ErrNoBuckets, bucket, to)
	case !found:
		return "", snap.refuse(ErrBucketOutOfRange, bucket, to)
	}
	switch {
	case row.Owner == "":
		return "", snap.refuse(ErrBucketFree, bucket, to)
	case !row.Held(snap.Now):
		return "", snap.refuse(ErrLeaseExpired, bucket, to)
	case row.ClaimWorker != "":
		return "", snap.refuse(ErrClaimPending, bucket, to)
	}
	load := map[string]int{}
	for _, b := range snap.Buckets {
		if b.Held(snap.Now) {
			load[b.Owner]++
		}
		if b.ClaimWorker != "" {
			load[b.ClaimWorker]++
		}
	}
	var candidates []string
	req.Buckets, req.Live = n, 0
	for _, m := range snap.Workers {
		if m.Live && !m.SessionGone {
			req.Live++
			if m.Worker != row.Owner {
				candidates = append(candidates, m.Worker)
			}
		}
	}
	switch {
	case to == row.Owner:
		return "", snap.refuse(ErrTargetIsOwner, bucket, to)
	case to != "":
		if !slices.Contains(candidates, to) {
			return "", snap.refuse(ErrTargetNotLive, bucket, to)
		}
		req.Load = load[to]
		return to, nil
	case len(candidates) == 0:
		return "", snap.refuse(ErrNoOtherWorker, bucket, to)
	}
	slices.SortFunc(candidates, func(a, b string) int {
		if c := cmp.Compare(load[a], load[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	req.Load = load[candidates[0]]
	return candidates[0], nil
}

// bucket returns the lease row of slot b.
func (s Snapshot) bucket(b int) (BucketState, bool) {
	for _, r := range s.Buckets {
		if r.Slot == b {
			return r, true
		}
	}
	return BucketState{}, false
}

// refuse builds RequestHandoff's refusal from what it read.
func (s Snapshot) refuse(reason error, bucket int, to string) *HandoffError {
	e := &HandoffError{Reason: reason, Subscription: s.Subscription, Bucket: bucket, To: to, Now: s.Now}
	for _, b := range s.Buckets {
		e.Buckets = max(e.Buckets, b.BucketCount)
	}
	e.Lease, _ = s.bucket(bucket)
	return e
}

// ErrRetiredGeneration: the slot belongs to a generation a resize retired
// (docs/design/resize.md); its checkpoints stay as its record and are not reset.
var ErrRetiredGeneration = errors.New("leasestore: the slot belongs to a retired generation")

// resetAllowed refuses an operator's fence during a resize and on a
// retired generation's slot. It locks the subscription's row FOR SHARE,
// first (the lock order of resizes: that row, then lease rows), so no
// resize begins before the reset commits.
func resetAllowed(ctx context.Context, tx pgx.Tx, st statements, subscription string, slot int) error {
	r, err := subscriptionRow{}.scan(tx.QueryRow(ctx, st.get("resize_share"), subscription))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil // no subscriptions row: a lease store of an older version's making, never resized
	case err != nil:
		return fmt.Errorf("leasestore: fence out slot %d: %w%s", slot, err, migrateHint(err))
	case r.state != ResizeSteady:
		return &ResizeInProgressError{Subscription: subscription, From: r.buckets, To: r.next, State: r.state,
			RequestedAt: orZero(r.requestedAt), RequestedBy: r.requestedBy}
	}
	if gen, _ := eventsource.SlotBucket(slot); gen < r.generation {
		return fmt.Errorf("leasestore: fence out slot %d of generation %d (serving: %d): %w", slot, gen, r.generation,
			ErrRetiredGeneration)
	}
	return nil
}
