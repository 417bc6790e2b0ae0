package eventsource_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	q.Start()
	defer q.Stop()
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
	q.Start()
	defer q.Stop()
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
