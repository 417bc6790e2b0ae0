package observability

import (
	"context"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/kumi-run/kumi/internal/obsname"
)

// SubscriptionStatus is one coordinator's view of its subscription: what
// this worker owns and how far behind each bucket is. It feeds the gauges
// (kumi.buckets.owned, kumi.lag.*, kumi.queue.depth) and the /status page.
type SubscriptionStatus struct {
	Subscription string `json:"subscription"`
	Worker       string `json:"worker"`
	// Buckets is the subscription's bucket count N.
	Buckets int `json:"buckets"`
	// LiveWorkers is the number of live workers last seen.
	LiveWorkers int `json:"live_workers,omitempty"`
	// Owned lists the buckets this worker holds, in any order.
	Owned []BucketStatus `json:"owned"`
	// Published is the position through which this process's publisher
	// has read the store and posted the events to its readers.
	Published int64 `json:"published,omitempty"`
}

// BucketStatus is one owned bucket.
type BucketStatus struct {
	// Generation and Bucket name the bucket as operators and `kumi
	// status` do: bucket 0 … N-1 of generation 0, then of each later
	// generation (one per resize). Slot is the number the store keys its
	// checkpoint and lease by (generation × 65536 + bucket).
	Generation int   `json:"generation"`
	Bucket     int   `json:"bucket"`
	Slot       int   `json:"slot"`
	Epoch      int64 `json:"epoch"`
	// State is the reader's state, free text such as "catching_up",
	// "live", "paused", "handing_off".
	State string `json:"state,omitempty"`
	// Checkpoint is the last checkpointed position.
	Checkpoint int64 `json:"checkpoint"`
	// LagEvents is the number of events in the bucket past the checkpoint,
	// LagSeconds the age of the oldest of them (0 when caught up).
	LagEvents  int64   `json:"lag_events"`
	LagSeconds float64 `json:"lag_seconds"`
	// QueueDepth is the number of live batches (each one publisher fetch's
	// events of the bucket) waiting in the reader's queue.
	QueueDepth int `json:"queue_depth"`
	// QueueBytes is the size of what waits in the reader's queue, in bytes.
	QueueBytes int64 `json:"queue_bytes"`
	// Parked is how many parked streams the bucket's reader holds (a
	// subscription that parks: see actors.ParkStream).
	Parked int `json:"parked,omitempty"`
	// Reader is what the bucket's reader last reported of itself; nil
	// while the bucket has no reader (a next generation's bucket on
	// standby, a handoff, a reader being replaced).
	Reader *ReaderStatus `json:"reader,omitempty"`
}

// ReaderStatus is a bucket reader's own account of where it stands: how
// far it has read and handled its bucket, and what it is waiting for. It
// answers an operator asking why a bucket does not move. A reader reports
// it at its start and then at every checkpoint tick while it has work —
// events pending, in flight or not yet checkpointed, a catch-up — and an
// idle reader's last report stands until something comes: At older than a
// few ticks beside Pending or InFlight says the reader itself is stuck.
type ReaderStatus struct {
	// Cursor is the position through which every event of the bucket was
	// read (queued or handled); Acked the position through which every
	// one was handled.
	Cursor int64 `json:"cursor"`
	Acked  int64 `json:"acked"`
	// Pending counts the events read and not yet delivered; InFlight the
	// events delivered (or waiting to be delivered again) and not yet
	// finished.
	Pending  int `json:"pending"`
	InFlight int `json:"in_flight"`
	// NextPending is the position of the first pending event, 0 if none.
	NextPending int64 `json:"next_pending,omitempty"`
	// CatchingUp: the reader reads the store and holds its live batches.
	CatchingUp bool `json:"catching_up,omitempty"`
	// Bounded: a resize bounds the reader at Bound, which is the resize's
	// cut once CutDecided; Proposing, it waits for its proposal's answer.
	Bounded    bool  `json:"bounded,omitempty"`
	Bound      int64 `json:"bound,omitempty"`
	CutDecided bool  `json:"cut_decided,omitempty"`
	Proposing  bool  `json:"proposing,omitempty"`
	// Draining: the reader finishes what it has and stops (a handoff, a
	// graceful stop, an unsure lease, an overflow).
	Draining bool `json:"draining,omitempty"`
	// HandlerReady is false while the handler is replaced or probed.
	HandlerReady bool `json:"handler_ready"`
	// At is when the reader reported this.
	At time.Time `json:"at"`
}

// RegisterStatus adds a source of subscription status, typically one per
// coordinator, and returns a function that removes it (call it when the
// coordinator stops, so its gauges disappear).
//
// f is called on every metrics collection (a Prometheus scrape) and every
// /status request, from those goroutines: it must be quick and must not
// block on an actor — return a snapshot the coordinator keeps up to date
// (for example an atomic.Pointer[SubscriptionStatus] stored after each pass
// and each checkpoint).
func (t *Telemetry) RegisterStatus(f func() SubscriptionStatus) (unregister func()) {
	if t == nil || f == nil {
		return func() {}
	}
	t.mu.Lock()
	t.next++
	id := t.next
	t.sources[id] = f
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(t.sources, id)
		t.mu.Unlock()
	}
}

// Status returns the status of every registered source, sorted by
// subscription then worker, with owned buckets sorted by number.
func (t *Telemetry) Status() []SubscriptionStatus {
	if t == nil {
		return []SubscriptionStatus{}
	}
	t.mu.Lock()
	fs := make([]func() SubscriptionStatus, 0, len(t.sources))
	for _, f := range t.sources {
		fs = append(fs, f)
	}
	t.mu.Unlock()
	out := make([]SubscriptionStatus, 0, len(fs))
	for _, f := range fs {
		s := f()
		owned := append([]BucketStatus(nil), s.Owned...)
		sort.Slice(owned, func(i, j int) bool { return owned[i].Bucket < owned[j].Bucket })
		if owned == nil {
			owned = []BucketStatus{}
		}
		s.Owned = owned
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Subscription != out[j].Subscription {
			return out[i].Subscription < out[j].Subscription
		}
		return out[i].Worker < out[j].Worker
	})
	return out
}

// observe is the gauges' callback.
func (t *Telemetry) observe(_ context.Context, o metric.Observer) error {
	for _, s := range t.Status() {
		o.ObserveInt64(t.inst.bucketsOwned, int64(len(s.Owned)), metric.WithAttributes(
			attribute.String(obsname.AttrSubscription, s.Subscription),
			attribute.String(obsname.AttrWorker, s.Worker)))
		for _, b := range s.Owned {
			opt := metric.WithAttributeSet(attribute.NewSet(
				attribute.String(obsname.AttrSubscription, s.Subscription),
				attribute.Int(obsname.AttrGeneration, b.Generation),
				attribute.Int(obsname.AttrBucket, b.Bucket)))
			o.ObserveInt64(t.inst.lagEvents, b.LagEvents, opt)
			o.ObserveFloat64(t.inst.lagSeconds, b.LagSeconds, opt)
			o.ObserveInt64(t.inst.queueDepth, int64(b.QueueDepth), opt)
			o.ObserveInt64(t.inst.queueBytes, b.QueueBytes, opt)
			o.ObserveInt64(t.inst.parkedStreams, int64(b.Parked), opt)
		}
	}
	return nil
}
