package actors

// Measuring the lag of the buckets a group holds.

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
)

// lagInterval spaces the lag measurements: counting a backlog costs a
// range scan per bucket, too much for every pass.
const lagInterval = 5 * time.Second

// measureLags keeps the owned buckets' lag at most lagInterval old, and
// measures it soon after the set of owned buckets changes, until ctx
// ends: it looks every heartbeat, and when the group's measurement is due
// it measures every group of the process in one statement (see
// Runtime.measureAllLags), so that the other groups find theirs fresh. It
// runs on its own goroutine, over the store's pool, bounded by
// DatabaseTimeout: the measurement is optional and may be slow, so it
// never rides on the lease passes, which renew the leases.
func (g *group) measureLags(ctx context.Context) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		decided := time.Now()
		if !g.lagDue(decided) {
			continue
		}
		mctx, cancel := context.WithTimeout(ctx, g.opts.DatabaseTimeout)
		err := g.rt.measureAllLags(mctx, g, decided)
		cancel()
		if err != nil && ctx.Err() == nil {
			g.logger.Debug("kumi: lag measurement failed; keeping the last one", "err", err)
		}
	}
}

// lagDue reports whether the group's lag is to be measured at now: its
// last measurement is lagInterval old, or was of other buckets.
func (g *group) lagDue(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return now.Sub(g.lagAt) >= lagInterval || len(g.owned) != len(g.lags)
}

// lagRequest is a group's part of a measurement of the process's lag.
type lagRequest struct {
	g    *group
	held []leasestore.Lease
}

// measureAllLags measures the lag of every group of the process that holds
// buckets, in one statement, and gives each group its part. A measurement
// made after decided (another group's, while the asking group waited for
// it) makes the asking group's unnecessary: it returns at once. A failed
// measurement leaves every group's last one (it counts as a try all the
// same, so that the groups do not retry at every heartbeat).
func (rt *Runtime) measureAllLags(ctx context.Context, asking *group, decided time.Time) error {
	rt.lagMu.Lock()
	defer rt.lagMu.Unlock()
	asking.mu.Lock()
	fresh := asking.lagAt.After(decided)
	asking.mu.Unlock()
	if fresh {
		return nil
	}
	rt.mu.Lock()
	groups := make([]*group, 0, len(rt.groups)+1)
	for gr := range rt.groups {
		groups = append(groups, gr.g)
	}
	rt.mu.Unlock()
	if !slices.Contains(groups, asking) {
		groups = append(groups, asking) // started, but not registered yet
	}
	var reqs []lagRequest
	var buckets []eventsource.LagBucket
	for _, g := range groups {
		held, resize := g.heldForLag()
		reqs = append(reqs, lagRequest{g: g, held: held})
		buckets = append(buckets, lagBuckets(g.opts.Subscription, g.opts.Category, held, resize)...)
	}
	var lags []eventsource.BucketBacklog
	var err error
	if len(buckets) > 0 {
		lags, err = rt.bucketLags(ctx, buckets)
	}
	at := time.Now()
	for _, r := range reqs {
		var part []eventsource.BucketBacklog
		if err == nil {
			part, lags = lags[:len(r.held)], lags[len(r.held):]
		}
		r.g.setLags(at, r.held, part, err)
	}
	return err
}

// heldForLag returns the group's held buckets and resize, as measuring
// their lag needs them.
func (g *group) heldForLag() ([]leasestore.Lease, leasestore.Resize) {
	g.mu.Lock()
	defer g.mu.Unlock()
	held := make([]leasestore.Lease, 0, len(g.owned))
	for _, l := range g.owned {
		held = append(held, l)
	}
	return held, g.resize
}

// setLags records a measurement of the held buckets' lag made at at (or
// its failure: the last one stays).
func (g *group) setLags(at time.Time, held []leasestore.Lease, lags []eventsource.BucketBacklog, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lagAt = at
	if err != nil {
		return
	}
	g.lags = make(map[int]bucketLag, len(held))
	for i, l := range held {
		g.lags[l.Slot] = bucketLag{checkpoint: lags[i].Checkpoint, events: lags[i].Events, oldest: lags[i].Oldest}
	}
}

// lagBuckets is what measuring the held buckets' lag asks of the store.
func lagBuckets(subscription, category string, held []leasestore.Lease, resize leasestore.Resize) []eventsource.LagBucket {
	out := make([]eventsource.LagBucket, len(held))
	for i, l := range held {
		out[i] = eventsource.LagBucket{Subscription: subscription, Category: category, Slot: l.Slot, Bucket: l.Bucket,
			Buckets: l.Buckets, Until: lagUntil(l, resize)}
	}
	return out
}

// lagUntil is the last position a held bucket has to deliver: the cut for
// a bucket of the serving generation once a resize decided it (its events
// beyond belong to the next generation), else none.
func lagUntil(l leasestore.Lease, r leasestore.Resize) int64 {
	if r.Resizing() && r.CutDecided && l.Generation == r.Generation {
		return r.Cut
	}
	return math.MaxInt64
}
