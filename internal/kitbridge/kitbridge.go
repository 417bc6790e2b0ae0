// Package kitbridge is the seam between package actors and the handler
// test kit (package kumitest): a Delivery and a Batch carry unexported
// fields (their answer's address and id), kumi's handler middleware is
// unexported, and a handler's reply is read by actors' one pure function,
// classifyAnswer. actors sets these variables in an init (actors/kit.go),
// so that it exports nothing for the kit; kumitest, which imports actors,
// calls them. Nothing else should.
package kitbridge

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/supervisor"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// Message describes a delivery for [Deliver]: one event as a *Delivery, or
// Events as a *Batch.
type Message struct {
	Event        eventsource.RecordedEvent
	Events       []eventsource.RecordedEvent // set: a *Batch of them (Event is Events[0])
	Attempt      int
	Subscription string
	Generation   int
	Bucket       int
	Epoch        int64
	Fence        eventsource.Fence
	Context      context.Context
	ReplyTo      *actor.PID
	Exclusive    bool // MaxInFlight is 1
}

// Reply is a handler's tagged answer, as the reader receives it.
type Reply struct {
	ID      uint64
	Attempt int
	Msg     any
}

// Meaning is what classifyAnswer reads in a reply.
type Meaning struct {
	Outcome   observability.Outcome
	Committed bool
	After     time.Duration
	Reason    string
	Warn      string
}

// BatchMeaning is what classifyBatchAnswer reads in a reply to a batch.
type BatchMeaning struct {
	All, Committed bool // every event done (Committed: by the handler's own commit)
	Done           int  // the head's events done, when 0 < Done < n
	Alone          bool // failed as a whole: the head event is retried alone
	Next           any  // the answer for the first event not done
	Warn           string
}

var (
	// Props returns the user's handler props with kumi's middleware
	// (panic reporter, reply tagger, probe answerer) and the supervisor.
	Props func(user *actor.Props, supervisor *supervisor.Strategy) *actor.Props
	// Deliver makes the *actors.Delivery (or *actors.Batch) m describes,
	// with a fresh id, and returns it and its id.
	Deliver func(m Message) (msg any, id uint64)
	// Unwrap returns the reply a message received at ReplyTo carries.
	Unwrap func(msg any) (Reply, bool)
	// Classify is actors' classifyAnswer.
	Classify func(res any, err error, timeout time.Duration) Meaning
	// ClassifyBatch is actors' classifyBatchAnswer, for a batch of n
	// events.
	ClassifyBatch func(res any, n int) BatchMeaning
	// RetryVerdict is actors' retryVerdict: whether an event whose
	// attempt (from 0) asked for a retry is dead-lettered under the
	// group's policy, or else retried after wait; why is the reason to
	// record.
	RetryVerdict func(maxAttempts int, backoff supervision.Backoff, attempt, free int, after time.Duration, reason string) (deadLetter bool, wait time.Duration, why string)
	// ID returns the id of a *actors.Delivery or *actors.Batch (its first
	// event's delivery), and false for other messages.
	ID func(msg any) (uint64, bool)
)
