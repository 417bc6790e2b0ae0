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

// batchMeaning is what a handler's reply to a batch of n events means.
type batchMeaning struct {
	// all: every event is done (committed: by the handler's own
	// exactly-once commit).
	all, committed bool
	// done events of the batch's head are done (0 < done < n).
	done int
	// alone: the batch failed as a whole without saying where, and its
	// head event is retried alone.
	alone bool
	// next is the answer for the first event not done, to be read by
	// classifyAnswer.
	next any
	// warn, when set, is the Warn log for a reply that is not an answer
	// to a batch.
	warn string
}

// classifyBatchAnswer reads a handler's reply res to a batch of n events.
func classifyBatchAnswer(res any, n int) batchMeaning {
	var a BatchAck
	switch m := res.(type) {
	case BatchAck:
		a = m
	case *BatchAck:
		if m == nil {
			return batchMeaning{alone: true, next: Retry{Reason: "nil *BatchAck"}}
		}
		a = *m
	case Ack, *Ack, DeadLetter, *DeadLetter:
		return batchMeaning{alone: true, warn: msgWrongAnswer,
			next: Retry{Reason: fmt.Sprintf("unexpected answer %T to a batch: answer BatchAck", res)}}
	default:
		return batchMeaning{alone: true, next: res}
	}
	switch {
	case a.Done < 0 || a.Done > n:
		return batchMeaning{alone: true, next: Retry{Reason: fmt.Sprintf("BatchAck.Done %d outside a batch of %d events", a.Done, n)}}
	case a.Done == n:
		return batchMeaning{all: true, committed: a.Committed}
	}
	b := batchMeaning{done: a.Done, committed: a.Committed, next: a.Next}
	if b.next == nil {
		b.next = Retry{Reason: fmt.Sprintf("done up to event %d of %d", a.Done, n)}
	}
	return b
}

// retryVerdict decides about an event whose attempt (counted from 0)
// asked for a retry: dead-lettered once the attempts charged to it
// (attempt+1 less the free ones a handler replacement gave back) spend
// the policy's budget, else retried after wait — the longer of what the
// answer asked for and the backoff.
func retryVerdict(p RetryPolicy, attempt, free int, after time.Duration, reason string) (deadLetter bool, wait time.Duration, why string) {
	next := attempt + 1
	if next-free >= p.MaxAttempts {
		return true, 0, fmt.Sprintf("retry budget of %d attempts spent; last: %s", p.MaxAttempts, reason)
	}
	return false, max(after, p.Backoff.Next(next)), reason
}
