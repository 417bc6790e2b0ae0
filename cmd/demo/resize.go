package main

import (
	"context"
	"fmt"
	"time"

	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/leasestore"
)

// resize changes the subscription's bucket count while the workers run
// (docs/resize.md): from the configured N to 2N, and back. It builds the
// new count's consumer-group index and requests the resize, as `kumi
// resize --no-wait` does; the workers do the rest, and the live view and
// the log follow it (resizeNews).
func (d *demo) resize(why string) {
	now := d.serving()
	if now.Resizing() {
		d.logf("skip", "resize skipped: %s is already resizing %d → %d (%s)", subscription, now.Buckets,
			now.NextBuckets, now.State)
		return
	}
	n := now.Buckets
	if n == 0 {
		n = d.cfg.buckets
	}
	m := 2 * d.cfg.buckets
	if n != d.cfg.buckets {
		m = d.cfg.buckets
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.db.store.EnsureConsumerGroupIndex(ctx, m); err != nil {
		d.logf("error", "resize: the index for %d buckets: %v", m, err)
		return
	}
	r, err := leasestore.RequestResize(ctx, d.db.pool, d.db.schema, leasestore.ResizeRequest{
		Subscription: subscription, Buckets: m, By: "kumi-demo"})
	if err != nil {
		d.logf("error", "resize: %s", inspect.RedactURL(err.Error()))
		return
	}
	d.logf("resize", "%d → %d buckets requested (generation %d → %d): the old buckets agree on a cut, drain to it, "+
		"then the new ones start after it%s", r.Buckets, m, r.Generation, r.Generation+1, because(why))
}

// serving is the subscription's generation and resize as last read.
func (d *demo) serving() leasestore.Resize {
	if d.cur == nil {
		return leasestore.Resize{}
	}
	return d.cur.in.Resize
}

// resizeNews logs a resize's steps between two readings.
func (d *demo) resizeNews(prev, cur *sample) {
	a, b := prev.in.Resize, cur.in.Resize
	if a.State == b.State && a.Generation == b.Generation {
		return
	}
	c := inspect.CountResize(b)
	switch b.State {
	case leasestore.ResizeSealing:
		d.logf("resize", "sealing: the old buckets' holders propose bounds (%d/%d)", c.Proposed, len(b.Old))
	case leasestore.ResizeCut:
		d.logf("resize", "cut at position %d: the old buckets drain to it (%d/%d drained)", b.Cut, c.Drained, len(b.Old))
	case leasestore.ResizeSwitched:
		d.logf("resize", "switched: new buckets start after %d once their old ones drained (%d/%d ready)", b.Cut,
			c.Ready, len(b.New))
	case leasestore.ResizeSteady:
		if b.Generation > a.Generation {
			d.logf("resize", "done: generation %d serves with %d buckets", b.Generation, b.Buckets)
		} else {
			d.logf("resize", "cancelled: %d buckets (generation %d)", b.Buckets, b.Generation)
		}
	}
}

// resizeText is the live view's line about the generation and a running
// resize.
func resizeText(r leasestore.Resize) string {
	if !r.Resizing() {
		return fmt.Sprintf("generation %d · %d buckets", r.Generation, r.Buckets)
	}
	c := inspect.CountResize(r)
	cut := "cut not decided"
	if r.CutDecided {
		cut = fmt.Sprintf("cut %d", r.Cut)
	}
	return fmt.Sprintf("resizing %d → %d (generation %d → %d) · %s · %s · old drained %d/%d · new ready %d/%d",
		r.Buckets, r.NextBuckets, r.Generation, r.Generation+1, r.State, cut, c.Drained, len(r.Old), c.Ready, len(r.New))
}
