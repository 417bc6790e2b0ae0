package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/supervision"
)

// Defaults for [GroupOptions].
const (
	BatchSizeDefault          = 500
	MaxInFlightDefault        = 1
	QueueCapacityDefault      = 256
	QueueBytesDefault         = 8 << 20 // 8 MiB
	HandlerTimeoutDefault     = 30 * time.Second
	MaxAttemptsDefault        = 5
	CheckpointEveryDefault    = 100
	CheckpointIntervalDefault = 200 * time.Millisecond
	DatabaseTimeoutDefault    = 30 * time.Second
)

// Bounds of GroupOptions.QueueBytes and RuntimeOptions.QueueBytes.
const (
	MinQueueBytes        = 64 << 10 // GroupOptions.QueueBytes
	MinRuntimeQueueBytes = 16 << 20 // RuntimeOptions.QueueBytes: a few publisher fetches
	MaxQueueBytes        = 1 << 40  // both
)

// RetryPolicy bounds deliveries of one event.
type RetryPolicy struct {
	// MaxAttempts is the number of deliveries of an event before it is
	// dead-lettered. Default 5.
	MaxAttempts int
	// Backoff spaces retries; a handler's Retry.After, when longer, wins.
	Backoff supervision.Backoff
}

// GroupOptions configure one subscription group: a subscription to a
// category divided into Buckets, whose buckets this worker shares with every
// other worker running the same group.
type GroupOptions struct {
	// Subscription names the group; every worker of it uses the same name.
	Subscription string
	// Category is the category the group handles.
	Category string
	// Buckets is N when the subscription is created; once it exists, the
	// database's count rules (a resize changes it online: [Resize]), and a
	// worker whose Buckets differs logs that once at Warn and serves the
	// database's.
	Buckets int
	// Handler makes the handler actor; each bucket gets one of its own.
	// It receives *Delivery and answers Ack, Retry or DeadLetter.
	Handler *actor.Props
	// Worker identifies this worker; "" means a fresh id.
	Worker string

	// Lease chooses the lease kind and its timings (zero values: row
	// leases, TTL 30 s). Lease.Heartbeat is also the interval between
	// reconcile passes, for both kinds; Lease.NoListen stops the group's
	// lease store taking wake-ups from the runtime's notifier (the
	// process's one LISTEN connection), so that rebalances are found by
	// the passes alone, one heartbeat later.
	Lease leasestore.LeaseOptions
	Retry RetryPolicy
	// BatchSize is the catch-up page size per bucket, and how many read
	// events a reader holds before it leaves live batches in its queue.
	// Default 500.
	BatchSize int
	// QueueCapacity bounds each reader's queue of live batches. Default 256.
	QueueCapacity int
	// QueueBytes bounds, in bytes (eventsource.RecordedEvent.Size: data,
	// metadata and names), each reader's queue of live batches — crossing
	// it applies Overflow as a full queue does — and the events a reader
	// holds read but not yet delivered: it reads no further catch-up page
	// and takes no live batch while those reach QueueBytes, and reads pages
	// of at most QueueBytes. A queue holding no batch still takes one of
	// any size. RuntimeOptions.QueueBytes bounds every reader queue of the
	// process together, and each reader's read-ahead to its share of it
	// when that is smaller (see docs/operations.md, Memory). Default
	// 8 MiB; at least 64 KiB.
	QueueBytes int64
	// Overflow is what a full queue does; default [PauseAndResume].
	Overflow OverflowPolicy
	// MaxInFlight is how many events of a bucket may be with the handler at
	// once. Events of one stream are always delivered one at a time, in
	// order; raising it lets events of other streams go ahead, which pays
	// when the handler is fast or asynchronous. Default 1: strictly one at a
	// time, which [CommitWithCheckpoint] (exactly-once) and Batch require.
	MaxInFlight int
	// OnDeadLetter is what a dead letter does to the rest of its stream:
	// [SkipEvent] (the default) goes on past it; [ParkStream] parks the
	// stream, whose later events wait, in order, until an operator
	// releases it (see docs/design/parking.md).
	OnDeadLetter DeadLetterAction
	// HandlerTimeout bounds the wait for a handler's answer; a timeout
	// counts as a retry. Default 30 s.
	HandlerTimeout time.Duration
	// CheckpointEvery and CheckpointInterval batch checkpoint writes: a
	// write after this many acks, or this long after the last. Defaults
	// 100 and 200 ms.
	CheckpointEvery    int
	CheckpointInterval time.Duration
	// DatabaseTimeout bounds each database call of the readers and the
	// coordinator. Default 30 s.
	DatabaseTimeout time.Duration
	// Logger receives the group's logs; nil means the runtime's. kumi adds
	// the subscription (and, on the lease store's lines, the worker) to
	// every line itself: give a logger without them, or lines repeat keys.
	Logger *slog.Logger
	// Batch turns on batched deliveries: the handler receives a [*Batch]
	// of a bucket's events and answers once (see [BatchFunc]). Off by
	// default; it needs MaxInFlight 1.
	Batch BatchOptions
}

// invalid reports field of one of this package's option types (e.g.
// "GroupOptions.Buckets") as invalid.
func invalid(field string, value any, reason string) error {
	return &kumierr.ConfigError{Field: "actors." + field, Value: value, Reason: reason}
}

// reroot returns err with its field moved under the options that hold it:
// an error of another package's options (from, e.g. "leasestore.Config.")
// becomes one of ours (to, e.g. "GroupOptions.Lease."). Other errors pass.
func reroot(err error, from, to string) error {
	var ce *kumierr.ConfigError
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Field, from) {
		return err
	}
	return invalid(to+strings.TrimPrefix(ce.Field, from), ce.Value, ce.Reason)
}

// WithDefaults returns o with zero fields set to their defaults.
func (o GroupOptions) WithDefaults() GroupOptions {
	if o.BatchSize == 0 {
		o.BatchSize = BatchSizeDefault
	}
	if o.QueueCapacity == 0 {
		o.QueueCapacity = QueueCapacityDefault
	}
	if o.QueueBytes == 0 {
		o.QueueBytes = QueueBytesDefault
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = MaxInFlightDefault
	}
	if o.HandlerTimeout == 0 {
		o.HandlerTimeout = HandlerTimeoutDefault
	}
	if o.Retry.MaxAttempts == 0 {
		o.Retry.MaxAttempts = MaxAttemptsDefault
	}
	if o.Retry.Backoff.Max == 0 {
		o.Retry.Backoff.Max = 10 * time.Second
	}
	o.Retry.Backoff = o.Retry.Backoff.WithDefaults()
	if o.CheckpointEvery == 0 {
		o.CheckpointEvery = CheckpointEveryDefault
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = CheckpointIntervalDefault
	}
	if o.DatabaseTimeout == 0 {
		o.DatabaseTimeout = DatabaseTimeoutDefault
	}
	return o
}

// Validate checks the options (after defaults): the first invalid field is
// refused with a *[kumierr.ConfigError] naming it, e.g.
// "actors.GroupOptions.Buckets".
func (o GroupOptions) Validate() error {
	if err := eventsource.ValidateSubscription(o.Subscription); err != nil {
		return invalid("GroupOptions.Subscription", o.Subscription, err.Error())
	}
	if err := eventsource.ValidateCategory(o.Category); err != nil {
		return invalid("GroupOptions.Category", o.Category, err.Error())
	}
	if o.Worker != "" {
		if err := eventsource.ValidateName("worker id", o.Worker, leasestore.MaxWorkerLength); err != nil {
			return invalid("GroupOptions.Worker", o.Worker, err.Error()+"; use printable characters")
		}
	}
	switch {
	case o.Buckets < 1:
		return invalid("GroupOptions.Buckets", o.Buckets, "must be at least 1")
	case o.Buckets > leasestore.MaxBuckets:
		return invalid("GroupOptions.Buckets", o.Buckets, fmt.Sprintf("must be at most %d (leasestore.MaxBuckets)", leasestore.MaxBuckets))
	case o.Handler == nil:
		return invalid("GroupOptions.Handler", nil, "required: the props of your handler actor")
	case o.BatchSize < 1 || o.BatchSize > 10000:
		return invalid("GroupOptions.BatchSize", o.BatchSize, "must be in [1, 10000]")
	case o.QueueCapacity < 1:
		return invalid("GroupOptions.QueueCapacity", o.QueueCapacity, "must be at least 1")
	case o.QueueBytes < MinQueueBytes || o.QueueBytes > MaxQueueBytes:
		return invalid("GroupOptions.QueueBytes", o.QueueBytes, fmt.Sprintf("must be in [%d, %d] bytes (64 KiB to 1 TiB; 0 means %d)", MinQueueBytes, MaxQueueBytes, QueueBytesDefault))
	case o.MaxInFlight < 1 || o.MaxInFlight > 1024:
		return invalid("GroupOptions.MaxInFlight", o.MaxInFlight, "must be in [1, 1024]")
	case o.OnDeadLetter > ParkStream:
		return invalid("GroupOptions.OnDeadLetter", o.OnDeadLetter, "must be actors.SkipEvent or actors.ParkStream")
	case o.HandlerTimeout < 0:
		return invalid("GroupOptions.HandlerTimeout", o.HandlerTimeout, "must be positive")
	case o.Retry.MaxAttempts < 1:
		return invalid("GroupOptions.Retry.MaxAttempts", o.Retry.MaxAttempts, "must be at least 1")
	case o.Retry.Backoff.Validate() != nil:
		return reroot(o.Retry.Backoff.Validate(), "supervision.Backoff.", "GroupOptions.Retry.Backoff.")
	case o.CheckpointEvery < 1:
		return invalid("GroupOptions.CheckpointEvery", o.CheckpointEvery, "must be at least 1")
	case o.CheckpointInterval < 0:
		return invalid("GroupOptions.CheckpointInterval", o.CheckpointInterval, "must be positive")
	case o.DatabaseTimeout < 0:
		return invalid("GroupOptions.DatabaseTimeout", o.DatabaseTimeout, "must be positive")
	}
	if err := o.Batch.validate(o.MaxInFlight); err != nil {
		return err
	}
	return reroot(o.Lease.Validate(), "leasestore.LeaseOptions.", "GroupOptions.Lease.")
}
