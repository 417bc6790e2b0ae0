package overflow

import (
	"errors"
	"fmt"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
)

// Policy says what a [Queue] does with a batch posted while it already holds
// [Config.Capacity] batches. The zero value is [PauseAndResume].
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
	// DropOldest evicts the oldest queued batch to make room for the new one.
	// It is lossy by design; evictions are counted in [Stats.Evicted].
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

// OverflowError ends a subscription whose queue overflowed under
// [DropSubscription]. It classifies as permanent for kumi's supervision
// (it has a PermanentError method): restarting the consumer does not help.
type OverflowError struct {
	// Capacity is the queue's bound in batches.
	Capacity int
	// Posted counts the batches offered up to and including the one that
	// overflowed; Delivered the ones the consumer received.
	Posted, Delivered uint64
}

// Error describes the overflow and how to avoid it.
func (e *OverflowError) Error() string {
	return fmt.Sprintf("kumi: subscriber queue overflowed at %d batches after %d delivered of %d posted (policy %s): "+
		"speed up the handler, raise the queue capacity, or use %s",
		e.Capacity, e.Delivered, e.Posted, DropSubscription, PauseAndResume)
}

// Unwrap returns [ErrOverflowed].
func (e *OverflowError) Unwrap() error { return ErrOverflowed }

// PermanentError reports true: kumi's supervision stops, rather than
// restarts, a consumer that fails with this error.
func (e *OverflowError) PermanentError() bool { return true }

// Transition reports a change of a [Queue]'s [State] to [Config.OnTransition].
type Transition struct {
	From, To State
	// Stats is the queue's state just after the transition.
	Stats Stats
}

// CapacityDefault is the queue bound, in batches, used when
// [Config.Capacity] is zero.
const CapacityDefault = 64

// Config configures a [Queue]. The zero value is usable: capacity
// [CapacityDefault], policy [PauseAndResume], batches recognised by [Batch].
type Config struct {
	// Capacity bounds the number of queued batches; 0 means CapacityDefault.
	Capacity int
	// Policy applies when a batch is posted to a full queue.
	Policy Policy
	// IsBatch reports whether a message is bounded by the queue; nil means
	// "implements [Batch]". It sees messages already unwrapped from their
	// envelope and must be cheap and safe for concurrent use.
	IsBatch func(msg any) bool
	// OnTransition, if set, is called on every state change, under the
	// queue's lock so that calls arrive in order. It must be quick and must
	// not call the queue.
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

// ConfigError reports a field of [Config] that [New] refuses.
type ConfigError struct {
	Field  string // the Config field, e.g. "Capacity"
	Reason string // what is wrong and what is accepted
}

// Error returns "overflow: Config.<Field> <Reason>".
func (e *ConfigError) Error() string { return "overflow: Config." + e.Field + " " + e.Reason }

// ConfigError reports true: the error is a supervision.ConfigMarker, so
// supervision classifies it as invalid configuration.
func (e *ConfigError) ConfigError() bool { return true }

func (c Config) validate() error {
	if c.Capacity < 1 {
		return &ConfigError{"Capacity", fmt.Sprintf("is %d: it must be at least 1 (0 means %d)", c.Capacity, CapacityDefault)}
	}
	if !c.Policy.valid() {
		return &ConfigError{"Policy", fmt.Sprintf("is %v: use PauseAndResume, DropSubscription or DropOldest", c.Policy)}
	}
	return nil
}

func isBatch(msg any) bool {
	_, ok := msg.(Batch)
	return ok
}

// unwrap returns the message inside an envelope, as protoactor delivers it.
func unwrap(msg any) any { return actor.UnwrapEnvelopeMessage(msg) }
