package actors

// A group's status: for observability (statusSnapshot) and Group.Status.

import (
	"context"
	"sort"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

// statusSnapshot is the group's status for observability, from memory.
func (g *group) statusSnapshot() observability.SubscriptionStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := observability.SubscriptionStatus{Subscription: g.opts.Subscription, Worker: g.leases.Worker(), Buckets: g.buckets(), LiveWorkers: g.liveWorkers}
	for b, l := range g.owned {
		lag := g.lags[b]
		bs := observability.BucketStatus{Generation: l.Generation, Bucket: l.Bucket, Slot: b, Epoch: l.Epoch, State: "reading", Checkpoint: max(lag.checkpoint, g.progress[b]), LagEvents: lag.events}
		if st := g.readerStates[b]; st != "" {
			bs.State = st
		}
		if g.handoff[b] {
			bs.State = "handing_off"
		}
		if !l.Ready {
			bs.State = "standby" // a next generation's bucket, waiting for its feeders to drain
		}
		if !lag.oldest.IsZero() && lag.events > 0 {
			bs.LagSeconds = time.Since(lag.oldest).Seconds()
		}
		if q := g.queues[b]; q != nil {
			qs := q.Stats()
			bs.QueueDepth, bs.QueueBytes = qs.Depth, qs.Bytes
		}
		if rep, ok := g.reports[b]; ok {
			rs := rep.st
			bs.Reader = &rs
		}
		bs.Parked = g.parkedHolds.held(b)
		st.Owned = append(st.Owned, bs)
	}
	sort.Slice(st.Owned, func(i, j int) bool { return st.Owned[i].Slot < st.Owned[j].Slot })
	st.Published = g.rt.published.Load()
	return st
}

// buckets is the serving generation's bucket count: the database's, once
// a pass has read it, else the configured one. Call with mu held.
func (g *group) buckets() int {
	if g.resize.Buckets > 0 {
		return g.resize.Buckets
	}
	return g.opts.Buckets
}

// BucketStatus is one owned bucket's state.
type BucketStatus struct {
	// Bucket is the bucket within Generation (docs/design/resize.md); Slot the
	// key of its lease and checkpoint (the bucket itself in generation 0).
	Bucket     int   `json:"bucket"`
	Generation int   `json:"generation"`
	Slot       int   `json:"slot"`
	Epoch      int64 `json:"epoch"`
	// Ready is false for a next generation's bucket held on standby
	// during a resize: no reader until its feeders drained.
	Ready bool `json:"ready"`
	// Checkpoint is the stored position; Lag the bucket's events after it.
	Checkpoint int64 `json:"checkpoint"`
	Lag        int64 `json:"lag"`
	// HandingOff says a claimant waits for this bucket.
	HandingOff bool `json:"handing_off"`
	// QueueDepth is the reader's queue of live batches, QueueBytes their
	// size.
	QueueDepth int   `json:"queue_depth"`
	QueueBytes int64 `json:"queue_bytes"`
	// Reader is what the bucket's reader last reported of itself: how far
	// it read and handled, and what it waits for; nil while the bucket
	// has no reader.
	Reader *observability.ReaderStatus `json:"reader,omitempty"`
}

// Status is a snapshot of a group in this process.
type Status struct {
	Subscription string `json:"subscription"`
	Category     string `json:"category"`
	Worker       string `json:"worker"`
	// Buckets and Generation are the serving generation's, as the
	// database has them (see GroupOptions.Buckets).
	Buckets    int `json:"buckets"`
	Generation int `json:"generation"`
	// Resize is the resize in progress as the last pass read it: its
	// state (leasestore.ResizeSteady when none), next bucket count and
	// cut.
	Resize ResizeStatus   `json:"resize"`
	Head   int64          `json:"head"`
	Owned  []BucketStatus `json:"owned"`
}

// ResizeStatus is a resize in progress, as a group's last pass read it.
type ResizeStatus struct {
	State       leasestore.ResizeState `json:"state"`                  // leasestore.ResizeSteady when none runs
	NextBuckets int                    `json:"next_buckets,omitempty"` // M, while a resize runs
	Cut         int64                  `json:"cut,omitempty"`          // C, once CutDecided
	CutDecided  bool                   `json:"cut_decided,omitempty"`  // the state is cut or switched
}

// Status returns the buckets this worker owns with their epochs,
// checkpoints and lag (events of the bucket after its checkpoint).
func (gr *Group) Status(ctx context.Context) (Status, error) {
	g := gr.g
	g.mu.Lock()
	st := Status{Subscription: g.opts.Subscription, Category: g.opts.Category, Worker: g.leases.Worker(), Buckets: g.buckets(),
		Generation: g.resize.Generation, Resize: ResizeStatus{State: g.resize.State, NextBuckets: g.resize.NextBuckets,
			Cut: g.resize.Cut, CutDecided: g.resize.CutDecided}}
	if st.Resize.State == "" {
		st.Resize.State = leasestore.ResizeSteady
	}
	resize := g.resize
	held := make([]leasestore.Lease, 0, len(g.owned))
	for b, l := range g.owned {
		held = append(held, l)
		bs := BucketStatus{Bucket: l.Bucket, Generation: l.Generation, Slot: b, Epoch: l.Epoch, Ready: l.Ready,
			HandingOff: g.handoff[b]}
		if q := g.queues[b]; q != nil {
			qs := q.Stats()
			bs.QueueDepth, bs.QueueBytes = qs.Depth, qs.Bytes
		}
		if rep, ok := g.reports[b]; ok {
			rs := rep.st
			bs.Reader = &rs
		}
		st.Owned = append(st.Owned, bs)
	}
	g.mu.Unlock()
	sort.Slice(st.Owned, func(i, j int) bool { return st.Owned[i].Slot < st.Owned[j].Slot })
	head, err := g.store.HeadPosition(ctx)
	if err != nil {
		return st, err
	}
	st.Head = head
	if len(held) == 0 {
		return st, nil
	}
	lags, err := g.store.BucketLags(ctx, lagBuckets(g.opts.Subscription, g.opts.Category, held, resize))
	if err != nil {
		return st, err
	}
	bySlot := make(map[int]eventsource.BucketBacklog, len(lags))
	for i, l := range held {
		bySlot[l.Slot] = lags[i]
	}
	for i := range st.Owned {
		b := &st.Owned[i]
		b.Checkpoint, b.Lag = bySlot[b.Slot].Checkpoint, bySlot[b.Slot].Events
	}
	return st, nil
}
