package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/admin"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/termsafe"
	"github.com/kumi-run/kumi/leasestore"
)

type relinquishCmd struct {
	Subscription string        `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Bucket       int           `required:"" placeholder:"B" help:"The bucket whose owner should hand it over."`
	To           string        `placeholder:"WORKER" help:"The live worker to place the claim for (default: the least loaded live worker other than the owner)."`
	Wait         time.Duration `default:"0s" placeholder:"DURATION" help:"Wait up to this long for the bucket to change hands and say where it went (0: do not wait)."`
	Verbose      bool          `short:"v" help:"Explain what the claim leads to in each order of the workers' passes."`
}

// Run places the first phase of leasestore's two-phase handoff — a pending
// claim — in the name of a live worker other than the owner
// (leasestore.RequestHandoff, whose refusals it words). The owner's next
// reconfirm sees it, stops the bucket's reader, flushes its checkpoint and
// hands the bucket over; the claimant activates it on its next pass. This
// is the path a joining worker's claim takes, so nothing is delivered
// twice and nothing is skipped. The claim names a live worker because
// leasestore treats a claim by anyone else as stale and clears it.
func (c *relinquishCmd) Run(e *env) error {
	if c.Wait < 0 {
		return usageErrorf("--wait %v: must not be negative", c.Wait)
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	h, err := admin.Relinquish(e.ctx, store, c.Subscription, c.Bucket, c.To)
	if err != nil {
		return c.refused(e, err, store.Schema())
	}
	req, slot := h.HandoffRequest, h.Slot
	in := inspection(store.Schema(), req)
	owner, epoch, target := req.Owner, req.Epoch, req.To
	fmt.Fprintf(e.stdout, "asked %s to hand bucket %d (epoch %d) over to %s\n",
		termsafe.String(owner), c.Bucket, epoch, termsafe.String(target))
	for _, l := range predict(h, c.Verbose) {
		fmt.Fprintln(e.stdout, l)
	}
	if c.Wait == 0 {
		return nil
	}
	return c.watch(e, store, in, slot, owner, epoch)
}

// refused says why admin.Relinquish (leasestore.RequestHandoff) refused,
// in the CLI's terms: a usage error for what the command line got wrong.
func (c *relinquishCmd) refused(e *env, err error, schema string) error {
	var h *leasestore.HandoffError
	if !errors.As(err, &h) {
		return e.adminError(err)
	}
	row := h.Lease
	switch h.Reason {
	case leasestore.ErrNoBuckets:
		return fmt.Errorf("subscription %q has no buckets in schema %q: no worker has started it", c.Subscription, schema)
	case leasestore.ErrBucketOutOfRange:
		return usageErrorf("--bucket %d: subscription %q has buckets 0 to %d", c.Bucket, c.Subscription, h.Buckets-1)
	case leasestore.ErrBucketFree:
		return fmt.Errorf("bucket %d has no owner: nothing to hand over (a worker below its fair share claims it on its next pass)", c.Bucket)
	case leasestore.ErrLeaseExpired:
		return fmt.Errorf("bucket %d's lease (owner %s) expired %s: the next pass of any worker takes it without a handoff",
			c.Bucket, termsafe.String(row.Owner), ago(h.Now, row.Expires))
	case leasestore.ErrClaimPending:
		return fmt.Errorf("bucket %d already has a pending claim by %s (placed %s): its owner %s is handing it over",
			c.Bucket, termsafe.String(row.ClaimWorker), ago(h.Now, row.ClaimedAt), termsafe.String(row.Owner))
	case leasestore.ErrTargetIsOwner:
		return usageErrorf("--to %s: that worker is the bucket's owner", termsafe.String(h.To))
	case leasestore.ErrTargetNotLive:
		return usageErrorf("--to %s: not a live worker of %q (kumi status -s %s lists them)", termsafe.String(h.To), c.Subscription, c.Subscription)
	case leasestore.ErrNoOtherWorker:
		return fmt.Errorf("%s is the only live worker of %q: nobody could take bucket %d "+
			"(start another worker first; to stop %s, stop it gracefully)", termsafe.String(row.Owner), c.Subscription, c.Bucket, termsafe.String(row.Owner))
	default: // leasestore.ErrHandoffRaced
		return fmt.Errorf("bucket %d changed while the claim was placed (owner, claim or %s's liveness); "+
			"`kumi status -s %s` shows it now — retry if it still applies", c.Bucket, termsafe.String(h.To), c.Subscription)
	}
}

// inspection is the lease state a handoff request was decided on, as an
// inspection without checkpoints or lag, for predict and watch.
func inspection(schema string, req leasestore.HandoffRequest) inspect.Inspection {
	in := inspect.Inspection{Schema: schema, Subscription: req.Before.Subscription, Now: req.Before.Now,
		Buckets: req.Buckets, Workers: req.Before.Workers}
	for _, b := range req.Before.Buckets {
		in.Rows = append(in.Rows, inspect.BucketRow{BucketState: b, Live: b.Held(in.Now), Lag: -1})
	}
	return in
}

// predict says what the claim will lead to, from leasestore's rules and
// admin.Relinquish's fair-share check (h.AboveShare, h.Share), in a line or
// two (with verbose, how each order of passes plays out): a claimant whose
// pass finds it above the fair share (ceil(N/live)) withdraws its claims —
// before the owner has handed over, the owner keeps the bucket; after, the
// bucket is free and a worker below its share takes it (the old owner, as
// a rule) — and a worker below its share places claims on the buckets of
// one above it.
func predict(h admin.Handoff, verbose bool) []string {
	bucket, owner, target, load, share := h.Bucket, h.Owner, h.To, h.Loads, h.Share
	live := max(h.Live, 1)
	floor := h.Buckets / live
	o, t := termsafe.String(owner), termsafe.String(target)
	after := h.Load + 1 // its claim on the bucket is counted
	if h.AboveShare {
		out := []string{fmt.Sprintf("note: %s is at its fair share already (%d of ceil(%d/%d) = %d), so this claim puts it above: "+
			"it may withdraw it, or the two trade buckets (-v says when)",
			t, h.Load, h.Buckets, live, share)}
		if verbose {
			out = append(out,
				fmt.Sprintf("  if the claimant's next pass comes first: %s withdraws the claim and %s keeps bucket %d", t, o, bucket),
				fmt.Sprintf("  if the owner's comes first: it hands bucket %d over and, then below its share, claims one of "+
					"the claimant's buckets in the same pass:", bucket),
				fmt.Sprintf("  %s takes bucket %d and gives another bucket to %s", t, bucket, o),
				fmt.Sprintf("  should that claim not be placed, %s withdraws and bucket %d, free, goes back to %s", t, bucket, o),
				"  nothing is delivered twice either way; to move a bucket for good, give it to a worker below its share "+
					"(--to; `kumi status` shows the owners)")
		}
		return out
	}
	out := []string{fmt.Sprintf("next: the owner hands it over on its next pass; %s (then %d of its fair share %d) takes it on its own",
		t, after, share)}
	if verbose {
		out = append(out, "  the owner drains the bucket's reader and flushes its checkpoint first: nothing is delivered twice")
	}
	// The owner, one bucket lighter, places claims of its own when it is
	// below the share while another is above, or below the floor while
	// another is above that.
	ownerAfter := load[owner] - 1
	for w, n := range load {
		if w == owner || w == target {
			continue
		}
		if (ownerAfter < share && n > share) || (ownerAfter < floor && n > floor) {
			return append(out, fmt.Sprintf("then: the owner, below its share, claims a bucket back from %s", termsafe.String(w)))
		}
	}
	return out
}

// watch waits until the claim has been resolved — the bucket changed hands,
// or the claim was withdrawn — and the pool has settled (no pending claims,
// no live worker below its share while another is above it), then reports
// where the bucket went and which other buckets moved meanwhile.
func (c *relinquishCmd) watch(e *env, store *eventsource.Store, before inspect.Inspection, slot int, owner string, epoch int64) error {
	deadline := time.Now().Add(c.Wait)
	for {
		cur, err := inspect.Inspect(e.ctx, store, c.Subscription, "")
		if err != nil {
			return err
		}
		r, _ := rowOf(cur, slot)
		resolved := r.ClaimWorker == "" && r.Live
		if resolved && settled(cur) {
			switch {
			case r.Epoch == epoch:
				fmt.Fprintf(e.stdout, "the claim was withdrawn: %s still holds bucket %d at epoch %d\n",
					termsafe.String(owner), c.Bucket, epoch)
			case r.Owner == owner:
				fmt.Fprintf(e.stdout, "bucket %d went back to %s, at epoch %d (the claimant withdrew after the handoff)\n",
					c.Bucket, termsafe.String(owner), r.Epoch)
			default:
				fmt.Fprintf(e.stdout, "bucket %d is now held by %s at epoch %d\n", c.Bucket, termsafe.String(r.Owner), r.Epoch)
			}
			for _, m := range moves(before, cur, slot) {
				fmt.Fprintln(e.stdout, m)
			}
			return nil
		}
		if time.Now().After(deadline) {
			if resolved {
				fmt.Fprintf(e.stdout, "bucket %d is held by %s at epoch %d; the pool had not settled within %v "+
					"(`kumi status -s %s` shows it now)\n", c.Bucket, termsafe.String(r.Owner), r.Epoch, c.Wait, c.Subscription)
				return nil
			}
			return fmt.Errorf("bucket %d did not change hands within %v (owner %q, claim %q); `kumi status -s %s` shows it",
				c.Bucket, c.Wait, r.Owner, r.ClaimWorker, c.Subscription)
		}
		select {
		case <-e.ctx.Done():
			return e.ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// settled reports a pool with no pending claim in which no live worker is
// below its fair share while another is above it (nor below the floor
// while another is above that): no pass would move a bucket.
func settled(in inspect.Inspection) bool {
	live := max(in.LiveWorkers(), 1)
	share, floor := leasestore.FairShare(in.Buckets, live), in.Buckets/live
	owned := in.OwnedBy()
	low, lowFloor, high, highFloor := false, false, false, false
	for _, w := range in.Workers {
		if !w.Live || w.SessionGone {
			continue
		}
		n := owned[w.Worker]
		low, lowFloor = low || n < share, lowFloor || n < floor
		high, highFloor = high || n > share, highFloor || n > floor
	}
	for _, r := range in.Rows {
		if r.ClaimWorker != "" {
			return false
		}
	}
	return !(low && high) && !(lowFloor && highFloor)
}

// moves lists the buckets other than skip whose owner changed between two
// inspections.
func moves(before, after inspect.Inspection, skip int) []string {
	var out []string
	for _, r := range after.Rows {
		b, ok := rowOf(before, r.Slot)
		if r.Slot == skip || !ok || b.Epoch == r.Epoch {
			continue
		}
		from := "nobody"
		if b.Owner != "" {
			from = termsafe.String(b.Owner)
		}
		to := "nobody"
		if r.Owner != "" {
			to = termsafe.String(r.Owner)
		}
		out = append(out, fmt.Sprintf("meanwhile bucket %d moved from %s to %s (epoch %d)", r.Bucket, from, to, r.Epoch))
	}
	return out
}

// rowOf returns the row of slot.
func rowOf(in inspect.Inspection, slot int) (inspect.BucketRow, bool) {
	for _, r := range in.Rows {
		if r.Slot == slot {
			return r, true
		}
	}
	return inspect.BucketRow{}, false
}
