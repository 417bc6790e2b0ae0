package eventsource_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// If the events' identity sequence is reset below the sequencer's search
// watermark (ALTER SEQUENCE … RESTART; a logical-replication or blue/green
// move that does not carry sequence values), the events appended after it
// draw seqs the search never reached: before, they were never sequenced,
// and nothing said so. The sequencer must find the reset, report it once,
// and sequence every event, skipping none, in each stream's order.
func TestSequencerRecoversFromAResetSequence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	var low int64
	watermark := func() int64 {
		require.NoError(t, s.Pool().QueryRow(ctx, "SELECT low_seq FROM "+s.QuotedSchema()+".sequencer").Scan(&low))
		return low
	}
	restart := func() {
		var seq string
		require.NoError(t, s.Pool().QueryRow(ctx, "SELECT pg_get_serial_sequence($1, 'seq')", s.QuotedSchema()+".appends").Scan(&seq))
		_, err := s.Pool().Exec(ctx, "ALTER SEQUENCE "+seq+" RESTART WITH 1")
		require.NoError(t, err)
	}
	appendSome := func(from, n int) {
		for i := from; i < from+n; i++ {
			mustAppend(t, s, fmt.Sprintf("acct-%d", i%4), ev("E", fmt.Sprintf(`{"i":%d}`, i)))
		}
	}
	head := func() int64 {
		h, err := s.HeadPosition(ctx)
		require.NoError(t, err)
		return h
	}

	appendSome(0, 20)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		sequenceAll(t, s)
		return watermark() == 20
	}, "the watermark reaches the last seq")

	// A reset found by a step of this process: Sequence recovers and says so.
	restart()
	appendSome(20, 5) // seqs 1..5, below the watermark
	n, err := s.Sequence(ctx)
	var reset *eventsource.SequenceResetError
	require.ErrorAs(t, err, &reset)
	require.ErrorIs(t, err, eventsource.ErrSequenceReset)
	require.Equal(t, eventsource.SequenceResetError{Schema: s.Schema(), LastValue: 5, Watermark: 20, Seen: 20}, *reset)
	require.Contains(t, err.Error(), "setval(", "the message says what to do")
	require.Equal(t, 5, n)
	require.Equal(t, int64(25), head())
	n, err = s.Sequence(ctx)
	require.NoError(t, err, "reported once")
	require.Zero(t, n)

	// Let the watermark climb past the new seqs, then reset again and let a
	// Sequencer of another process (which has seen nothing before) find it.
	pgtest.Eventually(t, 10*time.Second, func() bool {
		sequenceAll(t, s)
		return watermark() == 5
	}, "the watermark climbs again after a reset")
	restart()
	appendSome(25, 3) // seqs 1..3 below the watermark 5
	other, err := eventsource.New(pgtest.NewPool(t, 2), eventsource.Config{Schema: s.Schema()})
	require.NoError(t, err)
	logs := &logCounter{}
	q := eventsource.NewSequencer(other, eventsource.SequencerOptions{Logger: slog.New(logs), MaxInterval: 5 * time.Millisecond})
	startSequencer(t, q)
	pgtest.Eventually(t, 10*time.Second, func() bool { return head() == 28 }, "the events after the second reset are sequenced")
	appendSome(28, 10) // seqs 4..13, across the old watermark
	pgtest.Eventually(t, 10*time.Second, func() bool { return head() == 38 }, "and those after them")
	require.NoError(t, q.Stop(context.Background()))
	require.Equal(t, int64(1), q.Stats().Resets, "the reset is reported once")
	require.Equal(t, 1, logs.count(slog.LevelError), "in one log line")

	// Every event once, at positions 1..38, each stream in version order.
	evs, err := s.ReadAll(ctx, 0, 1000)
	require.NoError(t, err)
	require.Len(t, evs, 38)
	next := map[string]int64{}
	for i, e := range evs {
		require.Equal(t, int64(i+1), e.Position)
		require.Equal(t, next[e.Stream], e.Version, "stream %s in version order", e.Stream)
		next[e.Stream]++
	}
}

// A step reads the sequence's last value M, then takes the sequencer row.
// Another process's step may commit in between, raising the watermark
// above M with seqs drawn since: that is no reset, and must not be taken
// for one. (Before, the step compared M with the watermark it read under
// the lock, found it below, logged a reset at Error, and searched the
// unsequenced index from 0: seen in BenchmarkLiveLatencyRemote, where the
// appender's and the worker's sequencers take turns.) Here the test holds
// the sequencer table locked while a step has read M, appends, numbers
// the new event and raises the watermark by hand, as another sequencer
// would, and lets the step go on.
func TestSequencerTakesNoRaiseOfTheWatermarkForAReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One connection, so that the step below finds its statements
	// prepared by sequenceAll's: a first use would wait for the lock
	// while preparing, before reading M.
	s, err := eventsource.New(pgtest.NewPool(t, 1), eventsource.Config{Schema: pgtest.NewSchema(t)})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	other, err := eventsource.New(pgtest.NewPool(t, 2), eventsource.Config{Schema: s.Schema()})
	require.NoError(t, err)
	q := s.QuotedSchema()
	mustAppend(t, s, "acct-0", ev("E", `{"i":0}`))
	sequenceAll(t, s)

	// The step must read M before the other "sequencer" commits, and take
	// the lock after: that needs its lock to wait, within its 2 s
	// lock_timeout. Should it time out (a stalled machine), try again.
	for attempt, head := 1, int64(1); ; attempt++ {
		tx, err := other.Pool().Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "LOCK TABLE "+q+".sequencer IN EXCLUSIVE MODE")
		require.NoError(t, err)
		type result struct {
			n   int
			err error
		}
		done := make(chan result, 1)
		go func() {
			n, err := s.Sequence(ctx)
			done <- result{n, err}
		}()
		pgtest.Eventually(t, 20*time.Second, func() bool {
			var waiting int
			err := other.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
				AND query LIKE '%' || $1 || '%SKIP LOCKED%'`, s.Schema()).Scan(&waiting)
			return err == nil && waiting == 1
		}, "the step waits for the sequencer row, having read the sequence")
		stream := fmt.Sprintf("acct-%d", attempt)
		mustAppend(t, other, stream, ev("E", fmt.Sprintf(`{"i":%d}`, attempt)))
		var seq int64
		require.NoError(t, tx.QueryRow(ctx, "SELECT seq FROM "+q+".appends WHERE stream_name = $1", stream).Scan(&seq))
		head++
		_, err = tx.Exec(ctx, "UPDATE "+q+".appends SET last_position = $1 WHERE seq = $2", head, seq)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "UPDATE "+q+".sequencer SET last_position = $1, low_seq = $2 WHERE id = 1", head, seq)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		got := <-done
		var pe *pgconn.PgError
		if errors.As(got.err, &pe) && pe.Code == "55P03" && attempt < 5 {
			t.Logf("attempt %d: the step's lock timed out first; again", attempt)
			continue
		}
		require.NoError(t, got.err, "a raise of the watermark by another sequencer is no reset")
		require.Zero(t, got.n, "nothing was left to number")
		requireAllInOrder(t, s, int(head))
		return
	}
}
