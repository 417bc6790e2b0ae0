package overflow

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/kumierr"
)

// Policy says what a [Queue] does with a batch posted while it is full: it
// holds [Config.Capacity] batches, or the batch would take it over
// [Config.MaxBytes] or its [Budget]. The zero value is [PauseAndResume].
type Policy int

const (
	// PauseAndResume (the default) is lossless: the queue enters [Paused],
	// discards the batches it holds (the consumer re-reads them from the
	// store), rejects every batch until the consumer calls [Queue.Resume],
	// and delivers a [*PausedSignal] to the consumer.
	PauseAndResume Policy = iota
	// DropSubscription ends the subscription: the queue enters [Overflowed]
	// for good, discards what it holds, rejects every later batch and
	// delivers an [*OverflowedSignal] carrying an [*OverflowError].
	DropSubscription
	// DropOldest evicts the oldest queued batches to make room for the new
	// one. It is lossy by design; evictions are counted in [Stats.Evicted]
	// and reported to [Config.OnTransition] ([Transition.Evicted]).
	// When the shared [Budget] has no room even for a queue emptied so, the
	// queue pauses as under PauseAndResume.
	DropOldest
)

var policyNames = [...]string{"pause_and_resume", "drop_subscription", "drop_oldest"}

// String returns the policy's configuration name, e.g. "pause_and_resume".
func (p Policy) String() string {
	if p < 0 || int(p) >= len(policyNames) {
		return fmt.Sprintf("Policy(%d)", int(p))
	}
	return policyNames[p]
}

// ParsePolicy parses a policy's configuration name as printed by
// [Policy.String]. Case, '-' and '_' are ignored, so "PauseAndResume",
// "pause-and-resume" and "pause_and_resume" are the same policy.
func ParsePolicy(s string) (Policy, error) {
	norm := strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(strings.TrimSpace(s)))
	for i, name := range policyNames {
		if strings.ReplaceAll(name, "_", "") == norm {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("overflow: unknown policy %q: use one of %s", s, strings.Join(policyNames[:], ", "))
}

func (p Policy) valid() bool { return p >= PauseAndResume && p <= DropOldest }

// State is a [Queue]'s subscription state. Transitions are Active → Paused
// → Active (PauseAndResume) and Active → Overflowed (DropSubscription,
// terminal).
type State int32

const (
	// Active queues accept batches.
	Active State = iota
	// Paused queues reject batches until [Queue.Resume].
	Paused
	// Overflowed queues reject batches for good; [Queue.Err] says why.
	Overflowed
)

// String returns "active", "paused" or "overflowed".
func (s State) String() string {
	switch s {
	case Active:
		return "active"
	case Paused:
		return "paused"
	case Overflowed:
		return "overflowed"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Batch marks the messages a [Queue] bounds: the publisher's batches. Every
// other message (acks, timers, control, the queue's own signals) passes
// unbounded. A message wrapped in an [actor.MessageEnvelope] is judged by
// the message inside. [Config.IsBatch] replaces this test.
type Batch interface {
	OverflowBatch()
}

// Sized is implemented by batches that know their size in bytes: a [Queue]
// counts it against [Config.MaxBytes] and [Config.Budget]. A batch that
// does not implement it counts 0 bytes. The size of a batch must not
// change while it is queued; compute it once, when the batch is made.
type Sized interface {
	OverflowBytes() int64
}

func sizeOf(msg any) int64 {
	if s, ok := msg.(Sized); ok {
		return max(s.OverflowBytes(), 0)
	}
	return 0
}

// PausedSignal is delivered to the consumer, in order with its other
// messages, when the queue enters [Paused]. The batches it held are gone;
// the consumer catches up from the store and calls [Queue.Resume] (see the
// package documentation for the exact protocol).
type PausedSignal struct{}

// OverflowedSignal is delivered to the consumer when the queue enters
// [Overflowed]. The consumer must end its subscription with Err.
type OverflowedSignal struct {
	Err *OverflowError
}

// ErrOverflowed is wrapped by every [*OverflowError]; test with errors.Is.
var ErrOverflowed = errors.New("kumi: subscriber queue overflowed")

// Bound names the bound of a [Queue] that a batch crossed.
type Bound string

// The bounds of a [Queue].
const (
	BoundBatches Bound = "batches" // Config.Capacity
	BoundBytes   Bound = "bytes"   // Config.MaxBytes
	BoundBudget  Bound = "budget"  // Config.Budget, shared with other queues
)

// OverflowError ends a subscription whose queue overflowed under
// [DropSubscription]. It classifies as permanent for kumi's supervision
// (it has a PermanentError method): restarting the consumer does not help.
type OverflowError struct {
	// Capacity is the queue's bound in batches.
	Capacity int
	// Posted counts the batches offered up to and including the one that
	// overflowed; Delivered the ones the consumer received.
	Posted, Delivered uint64
	// Bound is the bound the last batch crossed. For BoundBytes and
	// BoundBudget, Limit is that bound in bytes and Bytes what the queue
	// (BoundBytes) or every queue of the budget (BoundBudget) would have
	// held with the batch.
	Bound        Bound
	Bytes, Limit int64
}

// Error describes the overflow and how to avoid it.
func (e *OverflowError) Error() string {
	var what, raise string
	switch e.Bound {
	case BoundBytes:
		what, raise = fmt.Sprintf("its byte bound (%d bytes of %d)", e.Bytes, e.Limit), "its byte bound"
	case BoundBudget:
		what, raise = fmt.Sprintf("the byte budget shared by the process's queues (%d bytes of %d)", e.Bytes, e.Limit), "the shared byte budget"
	default:
		what, raise = fmt.Sprintf("%d batches", e.Capacity), "the queue capacity"
	}
	return fmt.Sprintf("kumi: subscriber queue overflowed at %s after %d delivered of %d posted (policy %s): "+
		"speed up the handler, raise %s, or use %s",
		what, e.Delivered, e.Posted, DropSubscription, raise, PauseAndResume)
}

// Unwrap returns [ErrOverflowed].
func (e *OverflowError) Unwrap() error { return ErrOverflowed }

// PermanentError reports true: kumi's supervision stops, rather than
// restarts, a consumer that fails with this error.
func (e *OverflowError) PermanentError() bool { return true }

// Transition reports a change of a [Queue]'s [State] to
// [Config.OnTransition], or an eviction, which changes none.
type Transition struct {
	From, To State
	// Evicted reports one batch evicted under [DropOldest] to make room for
	// a newer one; From and To are then the same state, [Active].
	Evicted bool
	// Stats is the queue's state just after the transition.
	Stats Stats
}

// CapacityDefault is the queue bound, in batches, used when
// [Config.Capacity] is zero.
const CapacityDefault = 64

// Config configures a [Queue]. The zero value is usable: capacity
// [CapacityDefault], no byte bound, policy [PauseAndResume], batches
// recognised by [Batch].
type Config struct {
	// Capacity bounds the number of queued batches; 0 means CapacityDefault.
	Capacity int
	// MaxBytes bounds the total size of the queued batches (see [Sized]);
	// 0 means no byte bound. A queue that holds no batch takes one of any
	// size, so a queue holds at most MaxBytes plus one batch.
	MaxBytes int64
	// Budget, if set, is a byte bound shared with other queues: a batch
	// the budget has no room for is refused as by a full queue, even by
	// an empty queue.
	Budget *Budget
	// Policy applies when a batch is posted to a full queue.
	Policy Policy
	// IsBatch reports whether a message is bounded by the queue; nil means
	// "implements [Batch]". It sees messages already unwrapped from their
	// envelope and must be cheap and safe for concurrent use.
	IsBatch func(msg any) bool
	// OnTransition, if set, is called on every state change and on every
	// eviction under DropOldest ([Transition.Evicted]), under the queue's
	// lock so that calls arrive in order. It must be quick and must not
	// call the queue.
	OnTransition func(Transition)
}

// WithDefaults returns c with zero fields replaced by their defaults.
func (c Config) WithDefaults() Config {
	if c.Capacity == 0 {
		c.Capacity = CapacityDefault
	}
	if c.IsBatch == nil {
		c.IsBatch = isBatch
	}
	return c
}

func (c Config) validate() error {
	if c.Capacity < 1 {
		return &kumierr.ConfigError{Field: "overflow.Config.Capacity", Value: c.Capacity, Reason: fmt.Sprintf("must be at least 1 (0 means %d)", CapacityDefault)}
	}
	if c.MaxBytes < 0 {
		return &kumierr.ConfigError{Field: "overflow.Config.MaxBytes", Value: c.MaxBytes, Reason: "must be at least 0 (0 means no byte bound)"}
	}
	if !c.Policy.valid() {
		return &kumierr.ConfigError{Field: "overflow.Config.Policy", Value: c.Policy, Reason: "use PauseAndResume, DropSubscription or DropOldest"}
	}
	return nil
}

func isBatch(msg any) bool {
	_, ok := msg.(Batch)
	return ok
}

// unwrap returns the message inside an envelope, as protoactor delivers it.
func unwrap(msg any) any { return actor.UnwrapEnvelopeMessage(msg) }

// Budget is a byte bound shared by several queues — typically every
// consumer queue of a process — so that their sum stays bounded whatever
// their number. A queue charges a batch's size (see [Sized]) to it when it
// queues the batch, and gives it back when the batch leaves the queue:
// delivered, evicted, discarded, or dropped by [Queue.Close]. A Budget is
// safe for concurrent use.
type Budget struct {
	limit int64
	used  atomic.Int64
}

// NewBudget returns a budget of limit bytes; limit must be at least 1.
func NewBudget(limit int64) (*Budget, error) {
	if limit < 1 {
		return nil, &kumierr.ConfigError{Field: "overflow limit", Value: limit, Reason: "must be at least 1 byte"}
	}
	return &Budget{limit: limit}, nil
}

// Limit returns the budget's bound in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Used returns the bytes queued now under the budget.
func (b *Budget) Used() int64 { return b.used.Load() }

// take charges n bytes if they fit; a nil budget takes everything.
func (b *Budget) take(n int64) bool {
	if b == nil || n == 0 {
		return true
	}
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// give returns n bytes; a nil budget ignores it.
func (b *Budget) give(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
}
