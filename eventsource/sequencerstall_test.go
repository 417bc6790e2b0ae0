package eventsource_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// holdSequencerRow opens a transaction on a connection of its own that
// locks the sequencer row and then does nothing: a holder whose process
// froze, or that was cut off, in the middle of a step (and, opened by
// hand, without the idle timeout a step sets for itself).
func holdSequencerRow(t *testing.T, s *eventsource.Store) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.sequencer WHERE id = 1 FOR UPDATE`, s.QuotedSchema()))
	require.NoError(t, err)
	return tx
}

// requireAllInOrder checks that $all holds the events appended to streams
// of n events each, at positions 1..total, each stream in version order.
func requireAllInOrder(t *testing.T, s *eventsource.Store, total int) {
	t.Helper()
	evs, err := s.ReadAll(context.Background(), 0, total+1)
	require.NoError(t, err)
	require.Len(t, evs, total)
	next := map[string]int64{}
	for i, e := range evs {
		require.Equal(t, int64(i+1), e.Position, "a gap in $all")
		require.Equal(t, next[e.Stream], e.Version, "stream %s out of order", e.Stream)
		next[e.Stream]++
	}
}

// TestSequencerTakesOverFromAStalledHolder: a session holds the sequencer
// row in an open transaction and sends nothing more. Another process's
// sequencer ends it (it was idle in its transaction past
// SequencerStallTimeout) and sequences, skipping and repeating nothing.
// Before, it waited for as long as the holder lived (with kumi's own
// holders, their 10 s idle timeout).
func TestSequencerTakesOverFromAStalledHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	mustAppend(t, s, "order-1", ev("A", `{}`))
	sequenceAll(t, s)

	holder := holdSequencerRow(t, s)
	mustAppend(t, s, "order-1", ev("B", `{}`), ev("C", `{}`))
	mustAppend(t, s, "order-2", ev("A", `{}`))
	n, err := s.Sequence(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the row is held: a step sequences nothing")

	q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
	startSequencer(t, q)
	pgtest.Eventually(t, 20*time.Second, func() bool {
		h, err := s.HeadPosition(ctx)
		return err == nil && h == 4
	}, "the stalled holder was never ended: nothing sequenced")
	require.EqualValues(t, 1, q.Stats().Takeovers)
	_, err = holder.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the holder's session was ended")

	mustAppend(t, s, "order-2", ev("B", `{}`))
	pgtest.Eventually(t, 20*time.Second, func() bool {
		h, err := s.HeadPosition(ctx)
		return err == nil && h == 5
	}, "sequenced after the takeover")
	requireAllInOrder(t, s, 5)
}

// TestSequencerLeavesAHolderAtWork: a holder that is running a statement
// (here a sleep; in life a step's assignment) is not stalled, however
// long: it is never ended, and its events are sequenced once it commits.
func TestSequencerLeavesAHolderAtWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	holder := holdSequencerRow(t, s)
	mustAppend(t, s, "order-1", ev("A", `{}`), ev("B", `{}`))

	q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
	startSequencer(t, q)
	// Sleep past several stall bounds while the sequencer keeps finding
	// the row held.
	_, err := holder.Exec(ctx, `SELECT pg_sleep(2)`)
	require.NoError(t, err)
	require.NoError(t, holder.Commit(ctx), "the holder at work was ended")
	pgtest.Eventually(t, 20*time.Second, func() bool {
		h, err := s.HeadPosition(ctx)
		return err == nil && h == 2
	}, "sequenced after the holder committed")
	require.Zero(t, q.Stats().Takeovers)
	require.NotZero(t, q.Stats().Attempts)
	requireAllInOrder(t, s, 2)
}

// TestSequencerTakeoverNeedsTheHoldersRole: the takeover needs to see the
// holder's session and to signal it. A sequencer under an unprivileged
// role ends a stalled holder of the same role, and leaves one of another
// role (here a superuser's) alone, without failing: its events are
// sequenced when that holder ends.
func TestSequencerTakeoverNeedsTheHoldersRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	pool := s.Pool()
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "kumi_seq_" + hex.EncodeToString(b[:])
	q, r := s.QuotedSchema(), pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		"CREATE ROLE " + r + " LOGIN",
		"GRANT USAGE ON SCHEMA " + q + " TO " + r,
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %[1]s.events, %[1]s.streams, %[1]s.appends TO %[2]s", q, r),
		"GRANT SELECT, UPDATE ON " + q + ".sequencer TO " + r,
		"GRANT SELECT ON SEQUENCE " + q + ".appends_seq_seq TO " + r,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+r)
		_, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
	})
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.MaxConns = role, 4
	rpool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(rpool.Close)
	rs, err := eventsource.New(rpool, eventsource.Config{Schema: s.Schema()})
	require.NoError(t, err)

	head := func() int64 {
		h, err := s.HeadPosition(ctx)
		require.NoError(t, err)
		return h
	}
	// A superuser's holder: not visible to the role, not ended.
	holder := holdSequencerRow(t, s)
	holderPID := holder.Conn().PgConn().PID()
	mustAppend(t, rs, "order-1", ev("A", `{}`))
	logs := &logCounter{}
	seq := eventsource.NewSequencer(rs, eventsource.SequencerOptions{Logger: slog.New(logs)})
	startSequencer(t, seq)
	// Wait until the holder has stalled past the bound, and the sequencer
	// has then tried a dozen times (its looks at the holder included).
	pgtest.Eventually(t, 20*time.Second, func() bool {
		var stalled bool
		err := pool.QueryRow(ctx, `SELECT state_change <= now() - $2::interval FROM pg_stat_activity WHERE pid = $1`,
			holderPID, eventsource.SequencerStallTimeout.String()).Scan(&stalled)
		return err == nil && stalled
	}, "the holder stalls")
	tries := seq.Stats().Attempts
	pgtest.Eventually(t, 20*time.Second, func() bool { return seq.Stats().Attempts >= tries+12 }, "the sequencer tries")
	require.Zero(t, head(), "nothing sequenced while the other role's holder holds the row")
	require.Zero(t, seq.Stats().Takeovers)
	require.Zero(t, seq.Stats().Failures, "not being allowed to see the holder is no failure")
	require.NoError(t, holder.Commit(ctx))
	pgtest.Eventually(t, 20*time.Second, func() bool { return head() == 1 }, "sequenced once the holder ended")

	// A holder of the sequencer's own role is ended.
	rconn, err := rpool.Acquire(ctx)
	require.NoError(t, err)
	defer rconn.Release()
	rholder, err := rconn.Begin(ctx)
	require.NoError(t, err)
	_, err = rholder.Exec(ctx, "SELECT 1 FROM "+q+".sequencer WHERE id = 1 FOR UPDATE")
	require.NoError(t, err)
	mustAppend(t, rs, "order-1", ev("B", `{}`))
	pgtest.Eventually(t, 20*time.Second, func() bool { return head() == 2 }, "the same role's stalled holder was never ended")
	require.EqualValues(t, 1, seq.Stats().Takeovers)
	logs.mu.Lock()
	warns := slices.Clone(logs.warns)
	logs.mu.Unlock()
	require.Len(t, warns, 1, "one warning: the takeover")
	require.Contains(t, warns[0], "ended a stalled holder")
	require.Contains(t, warns[0], "idle in transaction")
	requireAllInOrder(t, s, 2)
}

// gatedConn is a client connection whose reads wait while the gate is
// shut: a client that stops reading, so that the server, sending it a
// large result, blocks in ClientWrite once the socket buffers are full.
type gatedConn struct {
	net.Conn
	open chan struct{} // closed: reads go through
}

func (c *gatedConn) Read(b []byte) (int, error) {
	<-c.open
	return c.Conn.Read(b)
}

// TestSequencerEndsAHolderBlockedSendingToItsClient: a holder of the
// sequencer row whose client stopped reading in the middle of a large
// result is not idle — the server is blocked sending (ClientWrite), where
// no idle timeout fires — and is ended all the same.
func TestSequencerEndsAHolderBlockedSendingToItsClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	gate := &gatedConn{open: make(chan struct{})}
	close(gate.open)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		gate.Conn = c
		return gate, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	holder, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.sequencer WHERE id = 1 FOR UPDATE`, s.QuotedSchema()))
	require.NoError(t, err)
	pid := conn.PgConn().PID()
	gate.open = make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		_, err := holder.Exec(ctx, `SELECT repeat('x', 1000) FROM generate_series(1, 1000000)`)
		sent <- err
	}()
	// The holder's result, once its session is ended (here, should the
	// test fail before the sequencer does it) and its client reads again.
	var once sync.Once
	var sendErr error
	release := func() error {
		once.Do(func() {
			_, _ = s.Pool().Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
			close(gate.open)
			sendErr = <-sent
		})
		return sendErr
	}
	t.Cleanup(func() { _ = release() })
	pgtest.Eventually(t, 20*time.Second, func() bool {
		var wait string
		err := s.Pool().QueryRow(ctx, `SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&wait)
		return err == nil && wait == "ClientWrite"
	}, "the holder's server blocks sending")

	mustAppend(t, s, "order-1", ev("A", `{}`))
	q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
	startSequencer(t, q)
	pgtest.Eventually(t, 20*time.Second, func() bool {
		h, err := s.HeadPosition(ctx)
		return err == nil && h == 1
	}, "the holder blocked sending was never ended")
	require.EqualValues(t, 1, q.Stats().Takeovers)
	require.Error(t, release(), "the holder's session was ended")
	requireAllInOrder(t, s, 1)
}
