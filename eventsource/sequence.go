package eventsource

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
//
// Each step sets its own statement and lock timeouts (SET LOCAL: see
// [SequencerStatementTimeout]), whatever the role or database sets; a step
// that times out all the same is retried at once with half the batch, down
// to a single event, and the batch grows back after steps that succeed.
func (s *Store) Sequence(ctx context.Context) (int, error) {
	b := newStepSize()
	return s.sequence(ctx, &b, SequencerStatementTimeout)
}

// Defaults of the sequencer's transaction.
const (
	// SequencerStatementTimeout is the statement_timeout each sequencer
	// transaction sets for itself (SET LOCAL), overriding the role's or
	// the database's: far above what a step of SequencerBatchDefault
	// events needs (tens of milliseconds), short enough that a step stuck
	// on a sick server ends and is retried with a smaller batch.
	SequencerStatementTimeout = 5 * time.Second
	// SequencerLockTimeout is the lock_timeout each sequencer transaction
	// sets for itself: a step waiting behind DDL on the events table gives
	// up and backs off instead of queueing the store's appends' positions
	// behind an unbounded wait.
	SequencerLockTimeout = 2 * time.Second
	// growAfter is the number of full steps in a row after which a halved
	// batch doubles again.
	growAfter = 4
)

// stepSize is the sequencer's adaptive batch: halved when a step times out,
// doubled back towards SequencerBatchDefault after growAfter full steps in
// a row. timeouts counts the steps that timed out.
type stepSize struct {
	n, streak int
	timeouts  int64
}

func newStepSize() stepSize { return stepSize{n: SequencerBatchDefault} }

// timedOut records a step that was cancelled by a timeout; it reports
// whether a smaller batch is left to try.
func (b *stepSize) timedOut() bool {
	b.streak = 0
	b.timeouts++
	if b.n == 1 {
		return false
	}
	b.n = max(b.n/2, 1)
	return true
}

// done records a step that sequenced n events.
func (b *stepSize) done(n int) {
	if n < b.n {
		b.streak = 0
		return
	}
	if b.streak++; b.streak >= growAfter && b.n < SequencerBatchDefault {
		b.n, b.streak = min(b.n*2, SequencerBatchDefault), 0
	}
}

// isTimeout reports whether err is a statement cancelled by a timeout
// (statement_timeout, or a transaction_timeout): work that a smaller batch
// may finish in time.
func isTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "57014" || pe.Code == "25P04")
}

// sequence runs steps of b's size until one sequences less than a full
// batch, adapting b to timeouts.
func (s *Store) sequence(ctx context.Context, b *stepSize, timeout time.Duration) (int, error) {
	total := 0
	for {
		size := b.n
		n, err := s.sequenceOnce(ctx, size, timeout)
		total += n
		switch {
		case err == nil:
			b.done(n)
			if n < size {
				return total, nil
			}
		case ctx.Err() == nil && isTimeout(err) && b.timedOut():
		default:
			return total, err
		}
	}
}

// seqCandidate is a proposed watermark: every event with seq <= seq was
// inserted by a transaction whose xid is below xid.
type seqCandidate struct{ seq, xid int64 }

// sequenceOnce runs one sequencer transaction, of at most limit events,
// each of its statements after the first bounded by timeout.
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
func (s *Store) sequenceOnce(ctx context.Context, limit int, timeout time.Duration) (int, error) {
	s.seqMu.Lock()
	cand := s.seqCand
	s.seqMu.Unlock()

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("kumi: sequencer begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// One round trip, two statements in order: the settings and M, then
	// the lock and X.
	batch := &pgx.Batch{}
	batch.Queue(s.sql.sequencerLastSeq, s.q+".events", pgInterval(timeout), pgInterval(SequencerLockTimeout))
	batch.Queue(s.sql.sequencerLock)
	br := tx.SendBatch(ctx, batch)
	var lastSeq, last, low, xid int64
	err = br.QueryRow().Scan(nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, &lastSeq)
	if err == nil {
		err = br.QueryRow().Scan(&last, &low, &xid)
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
	if err := tx.QueryRow(ctx, s.sql.sequencerAssign, last, limit, s.NotifyChannel(), low, cand.seq, cand.xid).
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
	s.seqMu.Lock()
	if cand.xid == 0 || xmin >= cand.xid {
		s.seqCand.seq, s.seqCand.xid = lastSeq, xid
	}
	s.seqMu.Unlock()
	return int(n), nil
}

// pgInterval formats d for a PostgreSQL time setting, in milliseconds (at
// least 1: 0 would mean no limit).
func pgInterval(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
}

// WakeSequencer wakes this process's [Sequencer] at once. [Store.Append]
// does it itself; call it after committing a transaction that used
// [Store.AppendTx], or the sequencer finds those events at its next poll
// (MaxInterval, 50 ms by default).
func (s *Store) WakeSequencer() { s.signalAppended() }
