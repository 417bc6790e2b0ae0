package snippets

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/examples/internal/exampletest"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// appendAndRead is docs/design/eventsource.md's opening example.
func appendAndRead(ctx context.Context, pool *pgxpool.Pool, checkpoint int64) (eventsource.AppendResult, []eventsource.RecordedEvent, error) {
	// snippet: docs/design/eventsource.md
	store, err := eventsource.New(pool, eventsource.Config{Schema: "kumi"})
	if err != nil {
		return eventsource.AppendResult{}, nil, err
	}
	if err := store.Migrate(ctx); err != nil { // idempotent, safe from many processes
		return eventsource.AppendResult{}, nil, err
	}
	seq := eventsource.NewSequencer(store, eventsource.SequencerOptions{})
	if err := seq.Start(ctx); err != nil { // one per process that appends or subscribes
		return eventsource.AppendResult{}, nil, err
	}
	defer seq.Stop(context.Background())

	res, err := store.Append(ctx, "account-7", eventsource.NoStream, []eventsource.EventData{
		{Type: "Opened", Data: json.RawMessage(`{"owner":"ann"}`)},
	})
	if err != nil {
		return res, nil, err
	}
	events, err := store.ReadCategory(ctx, "account", checkpoint, 1000)
	// end snippet
	return res, events, err
}

// listen is docs/design/eventsource.md's notifier.
func listen(ctx context.Context, store *eventsource.Store, read func()) error {
	// snippet: docs/design/eventsource.md
	n, err := store.NewNotifier(eventsource.NotifierOptions{
		Channels: []string{"myapp_changes"}, // optional: more channels on the same connection
	})
	if err != nil {
		return err
	}
	l, err := n.Listen(store.NotifyChannel())
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer n.Stop(context.Background())
	for {
		read() // from its cursor until nothing is left
		select {
		case <-l.C(): // capacity 1: a burst of notifications is one tick
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// end snippet
}

// Each example uses the schema "kumi", as a user's program would: a
// database of its own.
func kumiPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), exampletest.NewDatabase(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestAppendAndRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := kumiPool(t)
	res, _, err := appendAndRead(ctx, pool, 0)
	require.NoError(t, err)
	require.Len(t, res.IDs, 1)
	// The sequencer stopped with the example; the next one gives the
	// position, and a read of the category returns the event.
	store, err := eventsource.New(pool, eventsource.Config{Schema: "kumi"})
	require.NoError(t, err)
	var events []eventsource.RecordedEvent
	pgtest.Eventually(t, time.Minute, func() bool {
		_, err := store.Sequence(ctx)
		require.NoError(t, err)
		events, err = store.ReadCategory(ctx, "account", 0, 10)
		require.NoError(t, err)
		return len(events) == 1
	}, "the event is sequenced")
	require.Equal(t, res.IDs[0], events[0].ID)
	// The example's append expects no stream: run again, it refuses.
	_, _, err = appendAndRead(ctx, pool, 0)
	require.ErrorIs(t, err, eventsource.ErrWrongExpectedVersion)
}

func TestListen(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	store := newStore(t)
	ticks := make(chan struct{}, 16)
	done := make(chan error, 1)
	go func() { done <- listen(ctx, store, func() { ticks <- struct{}{} }) }()
	<-ticks // listening: the first read
	// A sequencer's batch notifies the store's channel: the loop reads again.
	_, err := store.Append(context.Background(), "account-1", eventsource.Any, []eventsource.EventData{{Type: "Opened", Data: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	pgtest.Eventually(t, time.Minute, func() bool {
		_, err := store.Sequence(context.Background())
		require.NoError(t, err)
		select {
		case <-ticks:
			return true
		default:
			return false
		}
	}, "a notification wakes the loop")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}
