package main

import (
	"errors"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/admin"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/leasestore"
)

type checkpointsCmd struct {
	Show  cpShowCmd  `cmd:"" help:"Show a subscription's checkpoint per bucket, with the bucket's owner."`
	Reset cpResetCmd `cmd:"" help:"Set checkpoints to a position, backwards included (replay) or forwards (skip). Refused while a live owner holds the bucket, unless --force."`
}

type cpShowCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Category     string `short:"c" placeholder:"NAME" help:"The subscription's category, to show each bucket's lag."`
	Generation   *int   `placeholder:"G" help:"Show this generation's checkpoints: a retired one's, or during a resize the next one's (default: the serving generation; see docs/design/resize.md)."`
	JSON         bool   `name:"json" help:"Print JSON."`
}

type checkpointJSON struct {
	Generation int        `json:"generation"`
	Bucket     int        `json:"bucket"`
	Slot       int        `json:"slot"`
	Position   int64      `json:"position"`
	UpdatedAt  *time.Time `json:"updated_at"`
	Owner      string     `json:"owner"`
	Live       bool       `json:"live"`
	Epoch      int64      `json:"epoch"`
	Lag        *int64     `json:"lag"`
}

// Run prints the checkpoints of every bucket of one generation.
func (c *cpShowCmd) Run(e *env) error {
	if c.Generation != nil && *c.Generation < 0 {
		return usageErrorf("--generation %d: generations are numbered from 0", *c.Generation)
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := e.checkSubscription(c.Subscription); err != nil {
		return err
	}
	in, err := inspect.Inspect(e.ctx, store, c.Subscription, c.Category)
	if err != nil {
		return asUsage(err)
	}
	gen, err := in.Generation(in.Resize.Generation)
	if c.Generation != nil {
		gen, err = in.Generation(*c.Generation)
	}
	if err != nil {
		return usageErrorf("--generation %d: %v", *c.Generation, err)
	}
	out := generationCheckpoints(in, gen.Generation)
	if c.JSON {
		return e.printJSON(out)
	}
	if len(out) == 0 {
		if c.Generation != nil {
			return fmt.Errorf("generation %d of subscription %q has no buckets and no checkpoints in schema %q",
				gen.Generation, c.Subscription, store.Schema())
		}
		return fmt.Errorf("subscription %q has no buckets and no checkpoints in schema %q", c.Subscription, store.Schema())
	}
	if gens := in.Generations(); len(gens) > 1 {
		fmt.Fprintln(e.stdout, generationLine(in, gen, gens))
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUCKET\tPOSITION\tUPDATED\tOWNER\tEPOCH\tLAG")
	for _, r := range out {
		updated, owner, lag := "-", "-", "-"
		if r.UpdatedAt != nil {
			updated = ago(in.Now, *r.UpdatedAt)
		}
		if r.Owner != "" {
			owner = r.Owner
			if !r.Live {
				owner += " (expired)"
			}
		}
		if r.Lag != nil {
			lag = fmt.Sprint(*r.Lag)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\n", r.Bucket, r.Position, updated, owner, r.Epoch, lag)
	}
	return tw.Flush()
}

// generationCheckpoints is generation g's buckets, by bucket: every one
// with a lease row, plus every checkpoint of g without one (a retired
// generation has checkpoints alone).
func generationCheckpoints(in inspect.Inspection, g int) []checkpointJSON {
	rows := map[int]checkpointJSON{}
	for _, r := range in.Rows {
		if r.Generation != g {
			continue
		}
		cj := checkpointJSON{Generation: g, Bucket: r.Bucket, Slot: r.Slot, Position: r.Checkpoint,
			UpdatedAt: timePtr(r.CheckpointAt), Owner: r.Owner, Live: r.Live, Epoch: r.Epoch}
		if r.Lag >= 0 {
			lag := r.Lag
			cj.Lag = &lag
		}
		rows[r.Bucket] = cj
	}
	for _, cp := range in.Checkpoints {
		cg, b := eventsource.SlotBucket(cp.Bucket)
		if _, ok := rows[b]; cg == g && !ok {
			rows[b] = checkpointJSON{Generation: g, Bucket: b, Slot: cp.Bucket, Position: cp.Position,
				UpdatedAt: timePtr(cp.UpdatedAt)}
		}
	}
	out := make([]checkpointJSON, 0, len(rows))
	for _, r := range rows {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b checkpointJSON) int { return a.Bucket - b.Bucket })
	return out
}

// generationLine says which generation the table shows, for a
// subscription with more than one.
func generationLine(in inspect.Inspection, gen inspect.Generation, gens []inspect.Generation) string {
	serving := in.Resize.Generation
	switch gen.Role {
	case inspect.GenerationRetired:
		return fmt.Sprintf("generation %d (retired; generation %d serves): %d buckets, drained to the cut %d",
			gen.Generation, serving, gen.Buckets, gen.Cut)
	case inspect.GenerationNext:
		return fmt.Sprintf("generation %d (next: resizing %d → %d, state %s; generation %d serves): %d buckets",
			gen.Generation, in.Resize.Buckets, in.Resize.NextBuckets, in.Resize.State, serving, gen.Buckets)
	}
	line := fmt.Sprintf("generation %d (serving): %d buckets", gen.Generation, gen.Buckets)
	switch serving {
	case 0:
	case 1:
		line += "; older generations: 0 (--generation G)"
	default:
		line += fmt.Sprintf("; older generations: 0 to %d (--generation G)", serving-1)
	}
	if len(gens) > serving+1 {
		line += fmt.Sprintf("; next, while the resize runs: %d", serving+1)
	}
	return line
}

type cpResetCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Bucket       []int  `placeholder:"B" help:"The bucket to reset (repeatable)."`
	AllBuckets   bool   `name:"all-buckets" help:"Reset every bucket of the subscription."`
	Position     *int64 `required:"" placeholder:"POSITION" help:"The new checkpoint: the bucket's next delivery is its first event after this global position (0: from the start)."`
	Force        bool   `help:"Reset even a bucket a live owner holds. The owner is fenced out like any earlier holder (the bucket's epoch grows): its reader restarts from the new checkpoint on its next pass, and what the old reader delivers until then may be delivered again; see docs/operations.md."`
	BeyondHead   bool   `name:"beyond-head" help:"Accept a --position past the store's head: the bucket then skips every event until the head passes it."`
}

// heldError is a bucket a live owner holds, refused without --force.
type heldError struct{ *leasestore.HeldError }

// Error names the owner and says what to do.
func (h heldError) Error() string {
	_, bucket := eventsource.SlotBucket(h.Bucket)
	return fmt.Sprintf("bucket %d is held by %s (epoch %d, lease expires in %s): "+
		"stop the subscription's workers (or wait until none holds it) and retry, or pass --force "+
		"(the owner is then fenced out and its reader restarts from the new checkpoint)",
		bucket, h.Owner, h.Epoch, roundDur(h.ExpiresIn))
}

// Run resets the selected buckets' checkpoints through
// admin.ResetCheckpoints: each in a transaction that first fences out
// every earlier holder of the bucket (leasestore.OperatorFence), refusing
// a live owner without --force.
func (c *cpResetCmd) Run(e *env) error {
	if *c.Position < 0 {
		return usageErrorf("--position %d: positions are >= 0", *c.Position)
	}
	if len(c.Bucket) == 0 && !c.AllBuckets {
		return usageErrorf("say which buckets: --bucket B (repeatable) or --all-buckets")
	}
	if len(c.Bucket) > 0 && c.AllBuckets {
		return usageErrorf("--bucket and --all-buckets exclude each other")
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	resets, err := admin.ResetCheckpoints(e.ctx, store, admin.Reset{Subscription: c.Subscription, Buckets: c.Bucket,
		AllBuckets: c.AllBuckets, Position: *c.Position, Force: c.Force, BeyondHead: c.BeyondHead})
	var refused []error
	for _, r := range resets {
		var held *leasestore.HeldError
		if r.Refused != nil && errors.As(r.Refused, &held) {
			refused = append(refused, heldError{held})
			continue
		}
		fmt.Fprintf(e.stdout, "bucket %d: checkpoint %d -> %d\n", r.Bucket, r.Before, *c.Position)
		switch out := r.Fenced; {
		case out.Live:
			fmt.Fprintf(e.stderr, "kumi checkpoints reset: warning: bucket %d is held by %s: fenced out "+
				"(epoch %d -> %d); its reader restarts from the new checkpoint on its next pass, and what "+
				"its old reader delivers until then may be delivered again\n", r.Bucket, out.Owner, out.Epoch-1, out.Epoch)
		case out.Found:
			fmt.Fprintf(e.stdout, "bucket %d: earlier holders fenced out (epoch %d -> %d)\n", r.Bucket, out.Epoch-1, out.Epoch)
		}
	}
	if err != nil {
		return e.adminError(err)
	}
	return errors.Join(refused...)
}
