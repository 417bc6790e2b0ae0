package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/worker"
)

type checkpointsCmd struct {
	Show  cpShowCmd  `cmd:"" help:"Show a subscription's checkpoint per bucket, with the bucket's owner."`
	Reset cpResetCmd `cmd:"" help:"Set checkpoints to a position, backwards included (replay) or forwards (skip). Refused while a live owner holds the bucket, unless --force."`
}

type cpShowCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Category     string `short:"c" placeholder:"NAME" help:"The subscription's category, to show each bucket's lag."`
	JSON         bool   `name:"json" help:"Print JSON."`
}

type checkpointJSON struct {
	Bucket    int        `json:"bucket"`
	Position  int64      `json:"position"`
	UpdatedAt *time.Time `json:"updated_at"`
	Owner     string     `json:"owner"`
	Live      bool       `json:"live"`
	Epoch     int64      `json:"epoch"`
	Lag       *int64     `json:"lag"`
}

// Run prints the checkpoints of every bucket.
func (c *cpShowCmd) Run(e *env) error {
	store, err := e.connect()
	if err != nil {
		return err
	}
	in, err := worker.Inspect(e.ctx, store, c.Subscription, c.Category)
	if err != nil {
		return asUsage(err)
	}
	cps, err := store.Checkpoints(e.ctx, c.Subscription)
	if err != nil {
		return err
	}
	// Every bucket with a lease row, plus any checkpoint without one.
	rows := map[int]checkpointJSON{}
	for _, r := range in.Rows {
		cj := checkpointJSON{Bucket: r.Bucket, Position: r.Checkpoint, UpdatedAt: timePtr(r.CheckpointAt),
			Owner: r.Owner, Live: r.Live, Epoch: r.Epoch}
		if r.Lag >= 0 {
			lag := r.Lag
			cj.Lag = &lag
		}
		rows[r.Bucket] = cj
	}
	for _, cp := range cps {
		if _, ok := rows[cp.Bucket]; !ok {
			rows[cp.Bucket] = checkpointJSON{Bucket: cp.Bucket, Position: cp.Position, UpdatedAt: timePtr(cp.UpdatedAt)}
		}
	}
	out := make([]checkpointJSON, 0, len(rows))
	for _, r := range rows {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b checkpointJSON) int { return a.Bucket - b.Bucket })
	if c.JSON {
		return e.printJSON(out)
	}
	if len(out) == 0 {
		return fmt.Errorf("subscription %q has no buckets and no checkpoints in schema %q", c.Subscription, store.Schema())
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

type cpResetCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Bucket       []int  `placeholder:"B" help:"The bucket to reset (repeatable)."`
	AllBuckets   bool   `name:"all-buckets" help:"Reset every bucket of the subscription."`
	Position     *int64 `required:"" placeholder:"POSITION" help:"The new checkpoint: the bucket's next delivery is its first event after this global position (0: from the start)."`
	Force        bool   `help:"Reset even a bucket a live owner holds. Its reader keeps its place in memory, and its next checkpoint write (which only moves forward) undoes a backward reset; see docs/operations.md."`
}

// heldError reports a bucket a live owner holds.
type heldError struct {
	bucket  int
	owner   string
	epoch   int64
	expires time.Duration
}

// Error names the owner and says what to do.
func (h *heldError) Error() string {
	return fmt.Sprintf("bucket %d is held by %s (epoch %d, lease expires in %s): its reader would undo the reset; "+
		"stop the subscription's workers (or wait until none holds it) and retry, or pass --force",
		h.bucket, h.owner, h.epoch, roundDur(h.expires))
}

// Run resets the selected buckets' checkpoints, each in a transaction
// fenced against a live owner.
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
	for _, b := range c.Bucket {
		if b < 0 {
			return usageErrorf("--bucket %d: buckets are numbered from 0", b)
		}
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	in, err := worker.Inspect(e.ctx, store, c.Subscription, "")
	if err != nil {
		return asUsage(err)
	}
	buckets := slices.Clone(c.Bucket)
	if c.AllBuckets {
		if in.Buckets == 0 {
			return fmt.Errorf("subscription %q has no lease rows, so its bucket count is unknown: name the buckets with --bucket",
				c.Subscription)
		}
		for b := range in.Buckets {
			buckets = append(buckets, b)
		}
	}
	slices.Sort(buckets)
	buckets = slices.Compact(buckets)
	if in.Buckets > 0 && buckets[len(buckets)-1] >= in.Buckets {
		return usageErrorf("--bucket %d: subscription %q has buckets 0 to %d", buckets[len(buckets)-1],
			c.Subscription, in.Buckets-1)
	}
	before := map[int]int64{}
	for _, r := range in.Rows {
		before[r.Bucket] = r.Checkpoint
	}
	if in.Buckets == 0 {
		cps, err := store.Checkpoints(e.ctx, c.Subscription)
		if err != nil {
			return err
		}
		for _, cp := range cps {
			before[cp.Bucket] = cp.Position
		}
	}
	var refused []error
	for _, b := range buckets {
		var held *heldError
		err := store.ResetCheckpoint(e.ctx, c.Subscription, b, *c.Position, c.fence(store, b, &held))
		switch {
		case err == nil && held != nil:
			fmt.Fprintf(e.stderr, "kumi checkpoints reset: warning: bucket %d is held by %s (epoch %d); "+
				"its reader goes on from where it is, and a backward reset lasts only until its next checkpoint write\n",
				b, held.owner, held.epoch)
			fallthrough
		case err == nil:
			fmt.Fprintf(e.stdout, "bucket %d: checkpoint %d -> %d\n", b, before[b], *c.Position)
		case errors.As(err, &held):
			refused = append(refused, err)
		default:
			return asUsage(err)
		}
	}
	if len(refused) > 0 {
		return errors.Join(refused...)
	}
	return nil
}

// fence checks, inside the reset's transaction and with the lease row
// locked FOR SHARE (so no claim or renewal commits in between), that no
// live owner holds the bucket. With --force it records the owner and lets
// the reset through.
func (c *cpResetCmd) fence(store *eventsource.Store, bucket int, held **heldError) eventsource.Fence {
	q := store.QuotedSchema()
	return eventsource.FenceFunc(func(ctx context.Context, tx pgx.Tx) error {
		var owner string
		var epoch int64
		var left *time.Duration
		err := tx.QueryRow(ctx, `SELECT coalesce(owner, ''), epoch,
    CASE WHEN expires_at > now() THEN (expires_at - now()) END
FROM `+q+`.lease_buckets WHERE subscription = $1 AND bucket = $2 FOR SHARE`, c.Subscription, bucket).
			Scan(&owner, &epoch, &left)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if owner == "" || left == nil {
			return nil
		}
		*held = &heldError{bucket: bucket, owner: owner, epoch: epoch, expires: *left}
		if c.Force {
			return nil
		}
		return *held
	})
}
