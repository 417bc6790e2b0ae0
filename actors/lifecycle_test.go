package actors

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/internal/startstop/startstoptest"
	"github.com/kumi-run/kumi/kumierr"
)

// The runtime, a group and the publisher keep kumi's lifecycle contract
// (docs/design/architecture.md, "Lifecycle").
func TestLifecycleContract(t *testing.T) {
	t.Parallel()
	store, _ := newTestStore(t)
	sys := quietSystem()
	t.Cleanup(sys.Shutdown)
	opts := RuntimeOptions{Logger: testLogger(), PollInterval: 50 * time.Millisecond}

	t.Run("Runtime", func(t *testing.T) {
		startstoptest.Stress(t, func(t *testing.T) startstop.Service {
			rt, err := New(sys, store, opts)
			require.NoError(t, err)
			return rt
		})
	})
	t.Run("Group", func(t *testing.T) {
		rt := newStopRuntime(t, sys, store.Schema())
		t.Cleanup(func() { require.NoError(t, rt.Stop(context.Background())) })
		startstoptest.Stress(t, func(t *testing.T) startstop.Service {
			gr, err := rt.NewGroup(groupOpts("lifecycle", 2, newRecorder(), ""))
			require.NoError(t, err)
			return gr
		})
	})
	t.Run("Publisher", func(t *testing.T) {
		startstoptest.Stress(t, func(t *testing.T) startstop.Service {
			return &publisherService{system: sys, logger: testLoggerOrDiscard(),
				props: newPublisherProps(store, publisherOptions{wake: make(chan struct{}), poll: time.Hour, logger: testLoggerOrDiscard(), tel: newTelemetry(nil, testLoggerOrDiscard())})}
		})
	})
}

// Start's context bounds the start only: the runtime's notifier keeps
// listening after it ends (it used to stop with it, while the sequencer
// did not), so that a runtime run by Run still hears notifications during
// its graceful stop.
func TestRuntimeOutlivesItsStartContext(t *testing.T) {
	t.Parallel()
	store, _ := newTestStore(t)
	sys := quietSystem()
	t.Cleanup(sys.Shutdown)
	ctx, cancel := context.WithCancel(context.Background())
	rt, err := startedRuntime(ctx, sys, store, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Stop(context.Background())) })
	pgtest.Eventually(t, waitLong, func() bool { return rt.notifier.Stats().Connected }, "notifier connected")
	cancel()

	// A channel added now is listened on by the live connection, which
	// wakes its listener: only a running notifier does that.
	var b [6]byte
	_, _ = rand.Read(b[:])
	l, err := rt.notifier.Listen("kumi_test_" + hex.EncodeToString(b[:]))
	require.NoError(t, err)
	defer l.Close()
	select {
	case <-l.C():
	case <-time.After(waitLong):
		t.Fatal("the runtime's notifier stopped with Start's context")
	}
	require.NoError(t, rt.Healthy(context.Background()))
}

// A group cannot start on a runtime that is not running: the error says
// why, and ErrStopped once the runtime has stopped.
func TestAGroupNeedsARunningRuntime(t *testing.T) {
	t.Parallel()
	store, _ := newTestStore(t)
	sys := quietSystem()
	t.Cleanup(sys.Shutdown)
	rt, err := New(sys, store, RuntimeOptions{Logger: testLogger()})
	require.NoError(t, err)
	_, err = rt.StartGroup(context.Background(), groupOpts("early", 1, newRecorder(), "w"))
	require.ErrorContains(t, err, "not started")
	require.Error(t, rt.Healthy(context.Background()))
	require.NoError(t, rt.Stop(context.Background()))
	_, err = rt.StartGroup(context.Background(), groupOpts("late", 1, newRecorder(), "w"))
	require.ErrorIs(t, err, kumierr.ErrStopped)
	require.ErrorIs(t, rt.Start(context.Background()), kumierr.ErrStopped)
}

// A runtime whose start failed starts on a later try (its start undid
// what it did, and left nothing stopped for good).
func TestARuntimeStartsAfterAFailedStart(t *testing.T) {
	t.Parallel()
	_, schema := newTestStore(t)
	pool := pgtest.NewPool(t, 1)
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	sys := quietSystem()
	t.Cleanup(sys.Shutdown)
	rt, err := New(sys, store, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Stop(context.Background())) })

	conn, err := pool.Acquire(context.Background()) // the pool's one connection: the migration waits for it
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, rt.Start(ctx), context.DeadlineExceeded)
	conn.Release()

	require.NoError(t, rt.Start(context.Background()))
	require.NoError(t, rt.Healthy(context.Background()))
	require.True(t, pgtest.WaitFor(waitLong, func() bool { return rt.notifier.Stats().Connected }))
}
