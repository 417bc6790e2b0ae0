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
// the insertion order of their appends (each append's events get
// consecutive positions, in version order, from one update of its range),
// and returns how many events it sequenced. It is what a
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
// Each step sets its own statement and lock timeouts (SET LOCAL: 5 s and
// 2 s), whatever the role or database sets; a step
// that times out all the same is retried at once with half the batch (of
// appends), down to a single append, and the batch grows back after steps
// that succeed.
//
// When it finds that the appends' identity sequence was reset below the
// search watermark, it recovers (see sequenceOnce), goes on, and returns
// the events it sequenced with a [*SequenceResetError].
func (s *Store) Sequence(ctx context.Context) (int, error) {
	b := newStepSize()
	return s.sequenceOnPool(ctx, &b, sequencerStatementTimeout)
}

// sequenceOnPool is sequence on a connection of the store's pool.
func (s *Store) sequenceOnPool(ctx context.Context, b *stepSize, timeout time.Duration) (int, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("kumi: sequencer acquire: %w", err)
	}
	defer c.Release()
	return s.sequence(ctx, c.Conn(), b, timeout)
}

// Defaults of the sequencer's transaction.
const (
	// sequencerStatementTimeout is the statement_timeout each sequencer
	// transaction sets for itself (SET LOCAL), overriding the role's or
	// the database's: far above what a step of sequencerBatchDefault
	// events needs (tens of milliseconds), short enough that a step stuck
	// on a sick server ends and is retried with a smaller batch.
	sequencerStatementTimeout = 5 * time.Second
	// sequencerLockTimeout is the lock_timeout each sequencer transaction
	// sets for itself: a step waiting behind DDL on the events table gives
	// up and backs off instead of queueing the store's appends' positions
	// behind an unbounded wait.
	sequencerLockTimeout = 2 * time.Second
	// sequencerStallTimeout bounds how long a sequencer transaction may
	// sit idle, waiting for its client, while it holds the sequencer row,
	// the one point every event's position goes through. Each step sets it
	// as its idle_in_transaction_session_timeout (a healthy step is idle
	// only for a round trip), and a [Sequencer] that finds the row held by
	// a session stalled that long (idle in its transaction, or blocked
	// sending to its client) ends that session (see docs/design/eventsource.md, "A
	// stalled holder": its transaction rolls back, so nothing is skipped or
	// numbered twice).
	sequencerStallTimeout = 500 * time.Millisecond
	// growAfter is the number of full steps in a row after which a halved
	// batch doubles again.
	growAfter = 4
)

// stepSize is the sequencer's adaptive batch: halved when a step times out,
// doubled back towards sequencerBatchDefault after growAfter full steps in
// a row. timeouts counts the steps that timed out; held says whether the
// last step found another transaction holding the row.
type stepSize struct {
	n, streak int
	timeouts  int64
	held      bool // the last step found the row held by another transaction
}

func newStepSize() stepSize { return stepSize{n: sequencerBatchDefault} }

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
	if b.streak++; b.streak >= growAfter && b.n < sequencerBatchDefault {
		b.n, b.streak = min(b.n*2, sequencerBatchDefault), 0
	}
}

// isTimeout reports whether err is a statement cancelled by a timeout
// (statement_timeout, or a transaction_timeout): work that a smaller batch
// may finish in time.
func isTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "57014" || pe.Code == "25P04")
}

// sequence runs steps of b's size on conn until one sequences less than a
// full batch, adapting b to timeouts. A reset of the sequence is reported
// after the steps that follow it.
func (s *Store) sequence(ctx context.Context, conn *pgx.Conn, b *stepSize, timeout time.Duration) (int, error) {
	total := 0
	var reset error
	for {
		size := b.n
		n, ranges, err := s.sequenceOnce(ctx, conn, size, timeout)
		b.held = errors.Is(err, errRowHeld)
		if b.held {
			return total, reset
		}
		total += n
		var re *SequenceResetError
		switch {
		case errors.As(err, &re):
			reset = err
			b.done(ranges)
		case err == nil:
			b.done(ranges)
			if ranges < size {
				return total, reset
			}
		case ctx.Err() == nil && isTimeout(err) && b.timedOut():
		default:
			return total, errors.Join(reset, err)
		}
	}
}

// errRowHeld is sequenceOnce's report that another transaction holds the
// sequencer row: not a failure (Store.sequence returns what it has).
var errRowHeld = errors.New("kumi: another transaction holds the sequencer row")

// seqCandidate is a proposed watermark: every event with seq <= seq was
// inserted by a transaction whose xid is below xid. It also carries seen,
// the highest last value of the sequence that this store's steps have read
// since the last reset they found.
type seqCandidate struct {
	seq, xid, seen int64
	// server is the identity of the server the candidate was taken on:
	// its xids and seqs mean nothing on another (see sequenceOnce).
	server ServerIdentity
}

// ErrSequenceReset is wrapped by [*SequenceResetError].
var ErrSequenceReset = errors.New("kumi: the events' seq sequence was reset")

// SequenceResetError reports that the identity sequence of the events'
// seq column went backwards: below the sequencer's search watermark, or
// below the value this process last read. New events then draw seqs that
// the sequencer's search, which starts above the watermark, would never
// reach. The sequencer has already recovered when it returns this error:
// it lowered the watermark to 0 and sequenced what it found, skipping
// nothing. Set the sequence back above every seq in use (the message says
// how), so that new events stop sharing seqs with old ones.
type SequenceResetError struct {
	// Schema is the store's schema.
	Schema string
	// LastValue is the sequence's last value as read; Watermark the
	// watermark (low_seq) it was found below; Seen the last value this
	// process had read before (0 if none).
	LastValue, Watermark, Seen int64
}

// Error says what happened and what to do.
func (e *SequenceResetError) Error() string {
	return fmt.Sprintf("kumi: the appends' seq sequence in schema %q went back to %d (watermark %d, last seen %d): "+
		"the sequencer lowered its watermark to 0 and sequences the new events (nothing is skipped); "+
		"set the sequence above the appends' seqs: SELECT setval(pg_get_serial_sequence('%s.appends', 'seq'), (SELECT max(seq) FROM %s.appends))",
		e.Schema, e.LastValue, e.Watermark, e.Seen, pgIdent(e.Schema), pgIdent(e.Schema))
}

// Unwrap returns [ErrSequenceReset].
func (e *SequenceResetError) Unwrap() error { return ErrSequenceReset }

// pgIdent quotes a schema name for the SQL of a message.
func pgIdent(schema string) string { return pgx.Identifier{schema}.Sanitize() }

// sequenceOnce runs one sequencer transaction on conn, of at most limit
// appends (ranges), each of its statements after the one that sets its
// settings bounded by timeout; it returns the events and the ranges it
// numbered.
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
// for this bound, 64-bit (epoch and xid, so they never wrap), and only
// within one server history: the candidate is kept in memory with the
// identity of the server it was taken on (system identifier and timeline,
// see [ServerIdentity]) and dropped when a step finds another. After a
// failover the promoted standby's xids and seqs restart from what it
// replayed: a candidate from the old primary, its xid soon passed by the
// new one's, would raise the watermark above seqs that appends in flight
// on the new primary hold, and those would never get a position. The
// watermark itself is a seq in the database, written after every seq
// below it was settled, so it holds on whatever server replays it, and
// survives dump and restore.
//
// A reset of the sequence. All of this assumes that seqs only grow. If the
// sequence is set back (ALTER SEQUENCE … RESTART, a logical-replication or
// blue/green move that does not carry sequence values), new events draw
// seqs at or below the watermark, and a search above it never finds them.
// While seqs only grow, a watermark is never above a later M (it is
// raised to at most an M read before), and M never below the M of an
// earlier step; so M below the watermark as read before it (in the same
// statement, whose snapshot precedes the read of M), or below the M this
// process read in a step that began before this one, proves a reset. Not
// the watermark read under the lock: another process's step may commit
// between M and the lock, raising it with seqs drawn since. The step then
// lowers the watermark to 0, in its own transaction before it assigns, and
// drops the candidate (whose M may count seqs drawn again since). Lowering
// the watermark can never skip an event: it only lengthens the search, which
// then covers every seq. The watermark climbs back by the proof above,
// which holds across a reset (a transaction that drew a seq up to M after
// the reset still had its xid before M was read; those before the reset
// are long over). The events found are numbered in seq order, which after
// a reset is the order in which they were appended, and after every event
// already sequenced; so no cursor misses them and a stream's order holds
// (a stream whose append was in flight across the reset aside: its later
// event, with a seq drawn after the reset, could be numbered first). A
// reset undone by more appends than the old last value before any step
// reads the sequence goes unnoticed; the message of the error asks for the
// sequence to be set back above the events' seqs.
func (s *Store) sequenceOnce(ctx context.Context, conn *pgx.Conn, limit int, timeout time.Duration) (int, int, error) {
	s.seqMu.Lock()
	cand := s.seqCand
	s.seqMu.Unlock()
	seen, seenEpoch := s.seenHead()
	system, err := systemID(ctx, conn)
	if err != nil {
		return 0, 0, err
	}

	// Two round trips. The first begins the transaction and runs, in
	// order, the settings and M, then the lock and X; the second assigns
	// and commits (after a reset, lowering the watermark first). A step
	// that fails anywhere, or finds the row held, rolls back.
	committed := false
	defer func() {
		if committed {
			return
		}
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			// The transaction's state is unknown: no one may use the
			// connection again (the pool then drops it).
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = conn.Close(cctx)
		}
	}()
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(s.sql.sequencerLastSeq, s.q+".appends", pgInterval(timeout), pgInterval(sequencerLockTimeout),
		pgInterval(sequencerStallTimeout))
	batch.Queue(s.sql.sequencerLock)
	br := conn.SendBatch(ctx, batch)
	var lowBefore, lastSeq, last, low, xid int64
	var wal string
	_, err = br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, &lowBefore, &lastSeq)
	}
	if err == nil {
		err = br.QueryRow().Scan(&last, &low, &xid, &wal)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, 0, errRowHeld
		}
		return 0, 0, fmt.Errorf("kumi: sequencer lock: %w", err)
	}
	timeline, err := walTimeline(wal)
	if err != nil {
		return 0, 0, err
	}
	// Another server than the candidate's, or a head below what the
	// process saw: the candidate, and the last value it saw, are from
	// another history.
	server := ServerIdentity{System: system, Timeline: timeline}
	if s.observeServer(server, last, seen, seenEpoch) || cand.server != server {
		cand = seqCandidate{server: server}
	}
	if err := s.recordServerChanges(ctx); err != nil {
		s.cfg.Logger.Warn("kumi: sequencer: the failover record is behind; the next step tries again", "err", err)
	}
	var reset *SequenceResetError
	batch = &pgx.Batch{}
	if lastSeq < lowBefore || lastSeq < cand.seen { // see seqWentBack
		reset = &SequenceResetError{Schema: s.cfg.Schema, LastValue: lastSeq, Watermark: lowBefore, Seen: cand.seen}
		batch.Queue(s.sql.sequencerLowerWatermark, 0)
		low, cand = 0, seqCandidate{server: server}
	}
	if cand.xid > xid {
		// Xids went backwards: another server (a restored dump). The
		// candidate means nothing here.
		cand = seqCandidate{server: server}
	}
	batch.Queue(s.sql.sequencerAssign, last, limit, s.NotifyChannel(), low, cand.seq, cand.xid)
	batch.Queue("COMMIT")
	br = conn.SendBatch(ctx, batch)
	var n, ranges, newLast, newLow, xmin, saved, notified int64
	if reset != nil {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return 0, 0, fmt.Errorf("kumi: sequencer lowering the watermark after a reset: %w", err)
		}
	}
	if err := br.QueryRow().Scan(&n, &ranges, &newLast, &newLow, &xmin, &saved, &notified, nil); err != nil {
		_ = br.Close()
		return 0, 0, fmt.Errorf("kumi: sequencer assign: %w", err)
	}
	_, err = br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, 0, fmt.Errorf("kumi: sequencer commit: %w", err)
	}
	committed = true
	// A candidate is used once its xid is below a snapshot's xmin; then
	// (or if there is none) this step's becomes the next one.
	s.SawPosition(newLast)
	s.seqMu.Lock()
	if s.seqCand.server != server {
		s.seqCand = seqCandidate{server: server}
	}
	if cand.xid == 0 || xmin >= cand.xid {
		s.seqCand.seq, s.seqCand.xid = lastSeq, xid
	}
	s.seqCand.seen = max(s.seqCand.seen, lastSeq)
	if reset != nil {
		s.seqCand.seen = lastSeq
	}
	s.seqMu.Unlock()
	if reset != nil {
		return int(n), int(ranges), reset
	}
	return int(n), int(ranges), nil
}

// seqWentBack reports whether lastSeq, the sequence's last value read
// after low, the watermark, proves a reset: below the watermark, or below
// what a step of this store read before.
func (s *Store) seqWentBack(lastSeq, low int64) bool {
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	return lastSeq < low || lastSeq < s.seqCand.seen
}

// pgInterval formats d for a PostgreSQL time setting, in milliseconds (at
// least 1: 0 would mean no limit).
func pgInterval(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
}

// WakeSequencer wakes this process's [Sequencer] at once. [Store.Append]
// does it itself; call it after committing a transaction that used
// [Store.AppendTx], or the sequencer finds those events at its next poll
// (MaxInterval, 50 ms by default; IdleInterval, 1 s, when it was quiet).
func (s *Store) WakeSequencer() { s.signalAppended() }
