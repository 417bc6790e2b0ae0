package leasestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// txConn is what a pass's statements run on: the connection of the
// transaction that the pass's first batch began (see runPipelined), or,
// for the resize's transitions and notifications run elsewhere, a pgx.Tx.
type txConn interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// beginSQL starts a pipelined transaction: the first statement of its
// first batch.
const beginSQL = "BEGIN"

// errCommitRolledBack: COMMIT found the transaction failed (a statement
// failed and its error was not returned), and rolled it back.
var errCommitRolledBack = errors.New("commit: the transaction had failed and was rolled back")

// rollbackTimeout bounds the ROLLBACK of a pipelined transaction that
// failed, on a context of its own: the pass's own may have ended (a pass
// abandoned at its bound).
const rollbackTimeout = 2 * time.Second

// runPipelined runs fn in one transaction on a connection of the pool,
// without the round trip of its own that pgx.BeginFunc spends on BEGIN: fn
// queues beginSQL first in its first batch (nothing may run on conn
// before it), so that BEGIN and the transaction's first statements go in
// one round trip. runPipelined commits when fn returns nil and rolls back
// otherwise, within rollbackTimeout even when ctx has ended, so that the
// connection goes back to the pool idle and is reused: on a pool whose
// connections cancel a statement rather than close (the actors runtime's
// lease pool: pgconn.CancelRequestContextWatcherHandler), a pass
// abandoned at its bound costs no reconnect. A connection left inside a
// transaction (a rollback that failed, a connection closed to interrupt a
// statement) is not idle, and the pool closes it on release instead of
// reusing it.
func (s *Store) runPipelined(ctx context.Context, fn func(conn *commitTail) error) (err error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	conn := c.Conn()
	tail := &commitTail{Conn: conn}
	defer func() {
		if err != nil && !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			defer cancel()
			_, _ = conn.Exec(rctx, "ROLLBACK")
		}
	}()
	if err := fn(tail); err != nil {
		return err
	}
	if st := conn.PgConn().TxStatus(); st != 'T' {
		return fmt.Errorf("commit: the connection is not in a transaction (status %q): was %s queued first?", st, beginSQL)
	}
	if len(tail.notes) == 0 {
		tag, err := conn.Exec(ctx, "COMMIT")
		if err != nil {
			return err
		}
		if tag.String() == "ROLLBACK" {
			return errCommitRolledBack
		}
		return nil
	}
	// The notifications and the COMMIT in one round trip: the same
	// statements in the same order, in the same transaction (a NOTIFY is
	// delivered at the commit anyway). A failed notification makes the
	// server skip the COMMIT; the transaction is then rolled back above.
	b := &pgx.Batch{}
	for _, n := range tail.notes {
		b.Queue(n.sql, n.channel, n.payload)
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	for range tail.notes {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("leasestore: notify: %w", err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		_ = br.Close()
		return err
	}
	if err := br.Close(); err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return errCommitRolledBack
	}
	return nil
}

// runOneTrip sends b — a whole transaction, BEGIN to COMMIT — in one
// round trip on a connection of the pool, and reads its results with
// read. A transaction left open (a statement failed, ctx ended) is rolled
// back as runPipelined rolls back, so that the connection goes back to the
// pool idle.
func (s *Store) runOneTrip(ctx context.Context, b *pgx.Batch, read func(br pgx.BatchResults) error) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	conn := c.Conn()
	br := conn.SendBatch(ctx, b)
	err = read(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_, _ = conn.Exec(rctx, "ROLLBACK")
	}
	return err
}

// commitTail is the connection of a transaction runPipelined runs: the
// notifications sent on it (Store.notify) wait to go with the COMMIT, in
// its round trip.
type commitTail struct {
	*pgx.Conn
	notes []queuedNote
}

// queuedNote is a notification waiting for its transaction's COMMIT.
type queuedNote struct{ sql, channel, payload string }

// noteQueuer is a txConn that sends notifications with its COMMIT.
type noteQueuer interface {
	queueNote(sql, channel, payload string) bool
}

func (t *commitTail) queueNote(sql, channel, payload string) bool {
	t.notes = append(t.notes, queuedNote{sql, channel, payload})
	return true
}
