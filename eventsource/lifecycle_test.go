package eventsource_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/internal/startstop/startstoptest"
)

// The sequencer, the notifier and the read replica keep kumi's lifecycle contract
// (docs/design/architecture.md, "Lifecycle").
func TestLifecycle(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	t.Run("Sequencer", func(t *testing.T) {
		startstoptest.Stress(t, func(*testing.T) startstop.Service {
			return eventsource.NewSequencer(store, eventsource.SequencerOptions{})
		})
	})
	t.Run("Notifier", func(t *testing.T) {
		startstoptest.Stress(t, func(t *testing.T) startstop.Service {
			n, err := store.NewNotifier(eventsource.NotifierOptions{PollInterval: time.Millisecond})
			require.NoError(t, err)
			return n
		})
	})
	t.Run("ReadReplica", func(t *testing.T) {
		// Its "standby" is the primary's pool: the contract does not
		// depend on what the lag measurement finds.
		startstoptest.Stress(t, func(t *testing.T) startstop.Service {
			r, err := eventsource.NewReadReplica(store, store.Pool(), eventsource.ReadReplicaOptions{LagInterval: time.Millisecond})
			require.NoError(t, err)
			return r
		})
	})
}

// Start's context bounds the start only: a notifier keeps listening after
// it ends (it used to stop with it, while the sequencer did not).
func TestNotifierOutlivesItsStartContext(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	first, second := randomChannel(), randomChannel()
	n, err := eventsource.NewNotifier(pool, eventsource.NotifierOptions{Channels: []string{first}, PollInterval: -1})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, n.Start(ctx))
	t.Cleanup(func() { require.NoError(t, n.Stop(context.Background())) })
	pgtest.Eventually(t, 10*time.Second, func() bool { return n.Stats().Connected }, "notifier connected")
	cancel()

	// A channel added now is listened on by the live connection, which
	// wakes its listener: only a running notifier does that.
	l, err := n.Listen(second)
	require.NoError(t, err)
	defer l.Close()
	require.True(t, waitTick(l, 10*time.Second), "the notifier listens on a channel added after Start's context ended")
	notify(t, pool, second, "1")
	require.True(t, waitTick(l, 10*time.Second), "a notification wakes the listener after Start's context ended")
	require.True(t, n.Stats().Connected)
}

// startSequencer starts q until the test ends.
func startSequencer(t testing.TB, q *eventsource.Sequencer) {
	t.Helper()
	require.NoError(t, q.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, q.Stop(context.Background())) })
}
