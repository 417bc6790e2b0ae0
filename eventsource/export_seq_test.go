package eventsource

import (
	"context"
	"time"
)

// SequencerClock is the time source a test gives a Sequencer.
type SequencerClock = clock

// NewSequencerWithClock returns a stopped sequencer that waits on c.
func NewSequencerWithClock(s *Store, o SequencerOptions, c SequencerClock) *Sequencer {
	q := NewSequencer(s, o)
	q.clk = c
	return q
}

// SequenceWithin is Store.Sequence with the sequencer's own statement
// timeout set to timeout; it also returns the steps that timed out.
func (s *Store) SequenceWithin(ctx context.Context, timeout time.Duration) (int, int64, error) {
	b := newStepSize()
	n, err := s.sequenceOnPool(ctx, &b, timeout)
	return n, b.timeouts, err
}

// The sequencer's fixed timings, for the tests that check them.
const (
	SequencerStatementTimeout = sequencerStatementTimeout
	SequencerLockTimeout      = sequencerLockTimeout
	SequencerStallTimeout     = sequencerStallTimeout
	SequencerRetryMin         = sequencerRetryMin
	SequencerRetryMax         = sequencerRetryMax
	SequencerReconnectMax     = sequencerReconnectMax
	SequencerStuckAfter       = sequencerStuckAfter
	SequencerReportInterval   = sequencerReportInterval
	SequencerIdleAfter        = sequencerIdleAfter
	SequencerBatchDefault     = sequencerBatchDefault
)
