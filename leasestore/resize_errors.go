package leasestore

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kumi-run/kumi/kumierr"
)

// The refusals of [RequestResize] and [CancelResize] (docs/design/resize.md, API,
// CLI and errors). Each is returned alone or wrapped by one of the typed
// errors below: test them with errors.Is.
var (
	// ErrSameBuckets: the resize asks for the bucket count the subscription
	// has: nothing to do.
	ErrSameBuckets = errors.New("leasestore: the subscription already has that many buckets")
	// ErrNoSubscription: no worker has ever started the subscription (it has
	// no row in the subscriptions table), or the name is wrong.
	ErrNoSubscription = errors.New("leasestore: no such subscription")
	// ErrResizeInProgress: a resize of the subscription runs; see
	// *[ResizeInProgressError].
	ErrResizeInProgress = errors.New("leasestore: a resize is in progress")
	// ErrResizeSwitched: the resize has switched (a new bucket delivers) and
	// can no longer be cancelled; see *[ResizeSwitchedError].
	ErrResizeSwitched = errors.New("leasestore: the resize has switched and cannot be cancelled")
	// ErrNoResize: nothing to cancel, the subscription is steady.
	ErrNoResize = errors.New("leasestore: no resize in progress")
	// ErrOldWorkers: live workers speak a protocol older than resizes; see
	// *[OldWorkersError].
	ErrOldWorkers = errors.New("leasestore: workers of an older kumi version are live")
	// ErrNoEventStore: the schema has no event store (sequencer,
	// checkpoints), which a resize reads and writes.
	ErrNoEventStore = errors.New("leasestore: the schema has no event store tables")
	// ErrIndexMissing: the consumer-group index for the new bucket count is
	// missing or invalid. It is wrapped by a *[kumierr.ConfigError] naming
	// ResizeRequest.Buckets, whose Reason names the index and the command
	// that builds it.
	ErrIndexMissing = errors.New("leasestore: the consumer-group index for the new bucket count is not valid")
)

// ResizeInProgressError is returned by [RequestResize] while a resize of
// the subscription runs (at most one at a time): nothing was written.
type ResizeInProgressError struct {
	Subscription string      // the subscription
	From, To     int         // its bucket counts N and M
	State        ResizeState // the running resize's state
	RequestedAt  time.Time   // when it was requested (database clock)
	RequestedBy  string      // who requested it ("" unknown)
}

// Error names the running resize and what to do.
func (e *ResizeInProgressError) Error() string {
	by := ""
	if e.RequestedBy != "" {
		by = " by " + e.RequestedBy
	}
	return fmt.Sprintf("leasestore: %s is already resizing %d → %d (state %s, requested %s%s); cancel it or wait",
		e.Subscription, e.From, e.To, e.State, e.RequestedAt.UTC().Format("2006-01-02 15:04:05.000 UTC"), by)
}

// Unwrap returns [ErrResizeInProgress].
func (e *ResizeInProgressError) Unwrap() error { return ErrResizeInProgress }

// ResizeSwitchedError is returned by [CancelResize] once the resize has
// switched (a new bucket started delivering): nothing was changed.
type ResizeSwitchedError struct {
	Subscription string    // the subscription
	From, To     int       // its bucket counts N and M
	SwitchedAt   time.Time // when the switch committed (database clock)
}

// Error says why and what to do instead.
func (e *ResizeSwitchedError) Error() string {
	return fmt.Sprintf("leasestore: the resize of %s (%d → %d) switched at %s: a new bucket already delivers, "+
		"so it cannot be cancelled; let it complete and resize back to %d instead",
		e.Subscription, e.From, e.To, e.SwitchedAt.UTC().Format("2006-01-02 15:04:05.000 UTC"), e.From)
}

// Unwrap returns [ErrResizeSwitched].
func (e *ResizeSwitchedError) Unwrap() error { return ErrResizeSwitched }

// OldWorkersError is returned by [RequestResize] without
// ResizeRequest.EvictOldWorkers while live workers of the subscription run
// a kumi version that predates resizes (protocol 1): nothing was written.
type OldWorkersError struct {
	Subscription string   // the subscription
	Workers      []string // the live protocol-1 workers, sorted
}

// Error lists them and says how to proceed.
func (e *OldWorkersError) Error() string {
	return fmt.Sprintf("leasestore: %s has live workers of a kumi version that predates resizes (%s): "+
		"upgrade them first (docs/operations.md#upgrading), or evict them (--evict-old-workers; their "+
		"buckets move after a TTL)", e.Subscription, strings.Join(e.Workers, ", "))
}

// Unwrap returns [ErrOldWorkers].
func (e *OldWorkersError) Unwrap() error { return ErrOldWorkers }

// indexMissing is [RequestResize]'s refusal when the consumer-group index
// for the new bucket count does not exist or is invalid (left so by a
// cancelled CREATE INDEX CONCURRENTLY): no worker may read by the new
// count before it is valid. Nothing was written. It is a configuration
// error naming ResizeRequest.Buckets, wrapping [ErrIndexMissing]: the
// index must be built, by its owner, before the resize.
func indexMissing(buckets int, invalid bool) error {
	state := "does not exist"
	if invalid {
		state = "is invalid (an interrupted concurrent build)"
	}
	return &kumierr.ConfigError{Field: "leasestore.ResizeRequest.Buckets", Value: buckets, Err: ErrIndexMissing, Reason: fmt.Sprintf(
		"the consumer-group index %s %s: build it first (kumi migrate --group-size %d, as the tables' owner)", indexName(buckets), state, buckets)}
}
