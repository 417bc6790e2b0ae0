package eventsource_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func positionOf(t *testing.T, s *eventsource.Store, stream string, version int64) int64 {
	t.Helper()
	evs, err := s.ReadStream(context.Background(), stream, version, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	return evs[0].Position
}

func TestSequencer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AppendsAreSequencedInTheBackground", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
		startSequencer(t, q)
		mustAppend(t, s, "order-1", ev("A", `{}`))
		pgtest.Eventually(t, 5*time.Second, func() bool {
			h, err := s.HeadPosition(ctx)
			return err == nil && h == 1
		}, "sequenced")
	})

	t.Run("AnotherProcesssAppendsAreFoundByPolling", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		other, err := eventsource.New(pgtest.NewPool(t, 2), eventsource.Config{Schema: s.Schema()})
		require.NoError(t, err)
		q := eventsource.NewSequencer(s, eventsource.SequencerOptions{MaxInterval: 20 * time.Millisecond})
		startSequencer(t, q)
		mustAppend(t, other, "order-1", ev("A", `{}`))
		pgtest.Eventually(t, 5*time.Second, func() bool {
			h, err := s.HeadPosition(ctx)
			return err == nil && h == 1
		}, "sequenced")
	})

	t.Run("ConcurrentSequencersHandOutEachPositionOnce", func(t *testing.T) {
		t.Parallel()
		schema := pgtest.NewSchema(t)
		const procs, appends = 4, 150
		var stores []*eventsource.Store
		for range procs {
			s, err := eventsource.New(pgtest.NewPool(t, 4), eventsource.Config{Schema: schema})
			require.NoError(t, err)
			require.NoError(t, s.Migrate(ctx))
			q := eventsource.NewSequencer(s, eventsource.SequencerOptions{MinInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond})
			startSequencer(t, q)
			stores = append(stores, s)
		}
		var wg sync.WaitGroup
		for p, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range appends {
					_, err := s.Append(ctx, fmt.Sprintf("p%d-%d", p, i%7), eventsource.Any, []eventsource.EventData{ev("A", `{}`)})
					if !assertNoError(t, err) {
						return
					}
				}
			}()
		}
		wg.Wait()
		total := int64(procs * appends)
		pgtest.Eventually(t, 10*time.Second, func() bool {
			h, err := stores[0].HeadPosition(ctx)
			return err == nil && h == total
		}, "all sequenced")
		var n, lo, hi, distinct int64
		require.NoError(t, stores[0].Pool().QueryRow(ctx, "SELECT count(*), min(position), max(position), count(DISTINCT position) FROM "+
			eventsWithPositions(stores[0])+" ev").Scan(&n, &lo, &hi, &distinct))
		require.Equal(t, []int64{total, 1, total, total}, []int64{n, lo, hi, distinct}, "positions are exactly 1..n")
	})

	t.Run("ALongRunningAppenderHoldsNobodyBack", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		tx, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = s.AppendTx(ctx, tx, "slow-1", eventsource.Any, []eventsource.EventData{ev("Slow", `{}`)})
		require.NoError(t, err)

		// Appended after the open transaction, committed before it.
		mustAppend(t, s, "fast-1", ev("Fast", `{}`))
		n, err := s.Sequence(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the committed event is sequenced while the earlier one is still open")
		fast := positionOf(t, s, "fast-1", 0)
		require.Equal(t, int64(1), fast)

		require.NoError(t, tx.Commit(ctx))
		sequenceAll(t, s)
		slow := positionOf(t, s, "slow-1", 0)
		require.Greater(t, slow, fast, "the late commit gets a later position, so no cursor past 1 misses it")
	})

	t.Run("TheSearchWatermarkStaysBelowAnOpenAppendersEvents", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		watermark := func() (low, maxSeq int64) {
			require.NoError(t, s.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT low_seq FROM %[1]s.sequencer),
				(SELECT coalesce(max(seq), 0) FROM %[1]s.events)`, s.QuotedSchema())).Scan(&low, &maxSeq))
			return low, maxSeq
		}
		mustAppend(t, s, "before-1", ev("A", `{}`))
		rolledBack, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		_, err = s.AppendTx(ctx, rolledBack, "gone-1", eventsource.Any, []eventsource.EventData{ev("Gone", `{}`)})
		require.NoError(t, err)
		require.NoError(t, rolledBack.Rollback(ctx))
		// One step proposes a watermark, a later one confirms it once every
		// transaction older than the proposal has ended (in the whole
		// cluster: other tests' included).
		pgtest.Eventually(t, 10*time.Second, func() bool {
			sequenceAll(t, s)
			low, _ := watermark()
			return low == 2
		}, "the watermark passes a rolled-back event")

		open, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = open.Rollback(ctx) }()
		_, err = s.AppendTx(ctx, open, "slow-1", eventsource.Any, []eventsource.EventData{ev("Slow", `{}`)})
		require.NoError(t, err)
		// before-1 is seq 1, gone-1 seq 2, slow-1 seq 3.
		for i := range 5 {
			mustAppend(t, s, fmt.Sprintf("fast-%d", i), ev("Fast", `{}`))
			sequenceAll(t, s)
		}
		low, _ := watermark()
		require.Equal(t, int64(2), low, "the watermark stays below the open transaction's event")
		require.Equal(t, int64(6), positionOf(t, s, "fast-4", 0), "the others are sequenced meanwhile")

		require.NoError(t, open.Commit(ctx))
		sequenceAll(t, s)
		require.Equal(t, int64(7), positionOf(t, s, "slow-1", 0))
		pgtest.Eventually(t, 10*time.Second, func() bool {
			sequenceAll(t, s)
			low, maxSeq := watermark()
			return low == maxSeq
		}, "with nothing open, the watermark catches up")
	})

	t.Run("AStreamsAppendsAreSequencedInVersionOrder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		tx, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = s.AppendTx(ctx, tx, "order-1", eventsource.Any, []eventsource.EventData{ev("First", `{}`)})
		require.NoError(t, err)
		// A second append to the same stream waits for the first's lock...
		done := make(chan error, 1)
		go func() {
			_, err := s.Append(ctx, "order-1", eventsource.Any, []eventsource.EventData{ev("Second", `{}`)})
			done <- err
		}()
		pgtest.Eventually(t, 5*time.Second, func() bool {
			var waiting bool
			err := s.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%streams%' AND datname = current_database())`).Scan(&waiting)
			return err == nil && waiting
		}, "the second append waits")
		// ...and meanwhile other streams go on.
		mustAppend(t, s, "order-2", ev("Other", `{}`))
		require.NoError(t, tx.Commit(ctx))
		require.NoError(t, <-done)
		sequenceAll(t, s)
		require.Less(t, positionOf(t, s, "order-1", 0), positionOf(t, s, "order-1", 1))
	})

	t.Run("SequenceReturnsAtOnceWhileAnotherSequences", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustAppend(t, s, "order-1", ev("A", `{}`))
		tx, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SELECT 1 FROM "+s.QuotedSchema()+".sequencer FOR UPDATE")
		require.NoError(t, err)
		n, err := s.Sequence(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		require.NoError(t, tx.Rollback(ctx))
		n, err = s.Sequence(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	})
}

// A process's appends can take every connection of its pool (a burst, a
// slow server). Its sequencer runs on a connection of its own, so it goes
// on numbering events meanwhile: here another process's, found by polling.
// (Before, its steps waited in the pool's queue behind the appends, and
// every live delivery of the store with them.)
func TestSequencerDoesNotWaitForItsPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	const conns = 2
	s, err := eventsource.New(pgtest.NewPool(t, conns), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	other, err := eventsource.New(pgtest.NewPool(t, 2), eventsource.Config{Schema: schema})
	require.NoError(t, err)

	var held []*pgxpool.Conn
	release := sync.OnceFunc(func() {
		for _, c := range held {
			c.Release()
		}
	})
	t.Cleanup(release)
	for range conns {
		c, err := s.Pool().Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	require.EqualValues(t, conns, s.Pool().Stat().AcquiredConns(), "every connection of the sequencer's pool is taken")

	q := eventsource.NewSequencer(s, eventsource.SequencerOptions{MaxInterval: 20 * time.Millisecond})
	startSequencer(t, q)
	mustAppend(t, other, "order-1", ev("A", `{}`))
	mustAppend(t, other, "order-2", ev("B", `{}`))
	var head int64
	pgtest.Eventually(t, 20*time.Second, func() bool {
		var err error
		head, err = other.HeadPosition(ctx)
		return err == nil && head == 2
	}, "the events are sequenced while the sequencer's pool is taken")
	release()
	requireAllInOrder(t, s, 2)
}

// The sequencer's own connection, lost (here: its session terminated, as a
// restarted server or a pooler would), is made again at the next step,
// after the step that found it gone failed and backed off.
func TestSequencerMakesItsConnectionAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	app := "kumi-seq-" + schema
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	other, err := eventsource.New(pgtest.NewPool(t, 2), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	q := eventsource.NewSequencer(s, eventsource.SequencerOptions{MaxInterval: 20 * time.Millisecond})
	startSequencer(t, q)
	head := func() int64 {
		h, err := other.HeadPosition(ctx)
		require.NoError(t, err)
		return h
	}
	mustAppend(t, other, "order-1", ev("A", `{}`))
	pgtest.Eventually(t, 20*time.Second, func() bool { return head() == 1 }, "sequenced")

	var ended int
	require.NoError(t, other.Pool().QueryRow(ctx,
		`SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&ended))
	require.Positive(t, ended, "the sequencer's session was there to end")
	mustAppend(t, other, "order-2", ev("B", `{}`))
	pgtest.Eventually(t, 20*time.Second, func() bool { return head() == 2 }, "sequenced again after the connection was lost")
	require.Positive(t, q.Stats().Failures, "a step found the connection gone")
	requireAllInOrder(t, other, 2) // s's pool lost its connections too
}
