package actors

import (
	"fmt"
	"time"

	"github.com/kumi-run/kumi/observability"
)

// replyMeaning is what a handler's reply to one delivery means, decided apart
// from the reader that acts on it, so that every user of the delivery
// contract reads a reply the same way.
type replyMeaning struct {
	// outcome is OutcomeAck, OutcomeDeadLetter, OutcomeRetry, OutcomePanic
	// or OutcomeTimeout; all but the first two ask for a retry.
	outcome observability.Outcome
	// committed: an Ack whose handler wrote the checkpoint itself
	// (CommitWithCheckpoint).
	committed bool
	// after is the least wait a Retry asked for before the next attempt.
	after time.Duration
	// reason says why the event is retried or dead-lettered.
	reason string
	// warn, when set, is the Warn log for a handler that broke the
	// contract (no answer, or not an answer).
	warn string
}

// classifyAnswer reads a handler's reply res to a delivery; err is set
// when none came within timeout.
func classifyAnswer(res any, err error, timeout time.Duration) replyMeaning {
	switch m := res.(type) {
	case Ack:
		return replyMeaning{outcome: observability.OutcomeAck, committed: m.Committed}
	case *Ack:
		return replyMeaning{outcome: observability.OutcomeAck, committed: m != nil && m.Committed}
	case DeadLetter:
		return replyMeaning{outcome: observability.OutcomeDeadLetter, reason: m.Reason}
	case *DeadLetter:
		if m == nil {
			return replyMeaning{outcome: observability.OutcomeDeadLetter}
		}
		return replyMeaning{outcome: observability.OutcomeDeadLetter, reason: m.Reason}
	case Retry:
		return replyMeaning{outcome: observability.OutcomeRetry, after: m.After, reason: m.Reason}
	case *Retry:
		if m == nil {
			return replyMeaning{outcome: observability.OutcomeRetry}
		}
		return replyMeaning{outcome: observability.OutcomeRetry, after: m.After, reason: m.Reason}
	case *handlerPanicked:
		return replyMeaning{outcome: observability.OutcomePanic, reason: fmt.Sprintf("handler panicked: %v", m.reason)}
	}
	if err != nil {
		return replyMeaning{outcome: observability.OutcomeTimeout, reason: fmt.Sprintf("no answer within %v", timeout), warn: msgNoAnswer}
	}
	return replyMeaning{outcome: observability.OutcomeRetry,
		reason: fmt.Sprintf("unexpected answer %T: answer Ack, Retry or DeadLetter", res), warn: msgWrongAnswer}
}
