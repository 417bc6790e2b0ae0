package eventsource

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Sequence gives global positions to committed events that have none, in
// insertion order, and returns how many it sequenced. It is what a
// [Sequencer] runs; tests and tools call it directly. When another process
// is sequencing at that moment it returns 0 at once.
//
// Why this never skips an event: a reader follows position order from its
// checkpoint, and positions are handed out only here, after commit, under
// a lock on the single sequencer row, in increasing order. So an event that
// commits late gets a later position; it can never appear behind a cursor
// that has already passed its position. Per-stream order holds because an
// append to a stream waits for the stream's previous append to commit (the
// streams row lock) before it takes its insertion number (seq), so a
// stream's events are inserted, and so sequenced, in version order.
func (s *Store) Sequence(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := s.sequenceOnce(ctx)
		total += n
		if err != nil || n < SequencerBatchDefault {
			return total, err
		}
	}
}

// seqCandidate is a proposed watermark: every event with seq <= seq was
// inserted by a transaction whose xid is below xid.
type seqCandidate struct{ seq, xid int64 }

// sequenceOnce runs one sequencer transaction.
//
// The watermark. Every sequenced event leaves a dead entry in the partial
// index of unsequenced events, until VACUUM; a search from the start of
// that index would wade through all of them, more with every batch, and a
// busy store would outrun its sequencer. So the search starts above
// low_seq, a seq below which every event is sequenced or rolled back. It
// moves up only when that is known to be true:
//
//   - An append's transaction has an xid before it draws a seq: the append
//     statement writes the stream's row before it inserts events.
//   - The sequencer reads the sequence's last value M, and then takes an
//     xid X (its lock statement does): every transaction that drew a seq up
//     to M had its xid before M was read, so below X. (M, X) is a
//     candidate.
//   - A later assignment whose snapshot's xmin is at least X sees every
//     transaction below X finished: each event up to M is visible to it, or
//     rolled back. Having numbered every visible unsequenced event up to
//     the last one it took (all of them, if it took fewer than a batch), it
//     raises the watermark to the lower of M and that seq.
//
// An appender's open transaction holds the watermark below its events
// (its xid holds the snapshots' xmin back) but holds no one's positions
// back: it only makes the search longer while it lasts. Xids are used only
// for this bound, compared within one server's lifetime (the candidate is
// kept in memory); the watermark itself is a seq, so it survives dump and
// restore.
func (s *Store) sequenceOnce(ctx context.Context) (int, error) {
	s.seqMu.Lock()
	cand := s.seqCand
	s.seqMu.Unlock()

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// One round trip, two statements in order: M, then the lock and X.
	batch := &pgx.Batch{}
	batch.Queue(s.sql.sequencerLastSeq, s.q+".events")
	batch.Queue(s.sql.sequencerLock)
	br := tx.SendBatch(ctx, batch)
	var lastSeq, last, low, xid int64
	err = br.QueryRow().Scan(&lastSeq)
	if err == nil {
		err = br.QueryRow().Scan(&last, &low, &xid, nil, nil, nil, nil, nil, nil, nil)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil // another sequencer holds the row
		}
		return 0, fmt.Errorf("kumi: sequencer lock: %w", err)
	}
	if cand.xid > xid {
		// Xids went backwards: another server (a restored dump). The
		// candidate means nothing here.
		cand = seqCandidate{}
	}
	var n, newLast, newLow, xmin, saved, notified int64
	if err := tx.QueryRow(ctx, s.sql.sequencerAssign, last, SequencerBatchDefault, s.NotifyChannel(), low, cand.seq, cand.xid).
		Scan(&n, &newLast, &newLow, &xmin, &saved, &notified); err != nil {
		return 0, fmt.Errorf("kumi: sequencer assign: %w", err)
	}
	if saved > 0 {
		if err := tx.Commit(ctx); err != nil {
			return 0, fmt.Errorf("kumi: sequencer commit: %w", err)
		}
	}
	// A candidate is used once its xid is below a snapshot's xmin; then
	// (or if there is none) this step's becomes the next one.
	if cand.xid == 0 || xmin >= cand.xid {
		s.seqMu.Lock()
		s.seqCand = seqCandidate{seq: lastSeq, xid: xid}
		s.seqMu.Unlock()
	}
	return int(n), nil
}

// WakeSequencer wakes this process's [Sequencer] at once. [Store.Append]
// does it itself; call it after committing a transaction that used
// [Store.AppendTx], or the sequencer finds those events at its next poll
// (MaxInterval, 50 ms by default).
func (s *Store) WakeSequencer() { s.signalAppended() }
