package actors

import "github.com/kumi-run/kumi/internal/overflow"

// OverflowPolicy says what a reader's full queue of live batches does with
// the next batch (GroupOptions.Overflow). No policy loses an event for the
// group: batches a queue discards are re-read from the store.
type OverflowPolicy = overflow.Policy

// The overflow policies.
const (
	// PauseAndResume (the default) pauses the bucket's live feed, re-reads
	// what the queue held from the store, and resumes.
	PauseAndResume = overflow.PauseAndResume
	// DropSubscription ends the bucket's live subscription on an overflow:
	// its reader finishes the event in flight, flushes its checkpoint and
	// stops with the overflow error, reported as a supervision decision
	// and by the overflow metric; the next reader of the bucket goes on
	// from the checkpoint.
	DropSubscription = overflow.DropSubscription
	// DropOldest evicts the oldest queued batch to make room; the reader
	// re-reads the gap from the store.
	DropOldest = overflow.DropOldest
)

// ParseOverflowPolicy parses a policy's name as its String method prints
// it ("pause_and_resume", "drop_subscription", "drop_oldest"); case, '-'
// and '_' are ignored.
func ParseOverflowPolicy(s string) (OverflowPolicy, error) { return overflow.ParsePolicy(s) }
