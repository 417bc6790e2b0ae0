package actors

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// blockingHandler blocks on every delivery until release is closed, ignoring
// its context: a handler stuck in a call that never returns. started is
// closed at the first delivery.
func blockingHandler(started, release chan struct{}) *actor.Props {
	first := make(chan struct{}, 1)
	first <- struct{}{}
	return actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*Delivery); ok {
			select {
			case <-first:
				close(started)
			default:
			}
			<-release
			ctx.Respond(Ack{})
		}
	})
}

// A handler blocked forever must not keep Runtime.Stop (and so the worker
// process) from returning: the stop honours its context and returns
// ctx.Err(), leaving the blocked handler behind.
func TestRuntimeStopHonoursItsContextWhileAHandlerIsBlocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 1)
	started, release := make(chan struct{}), make(chan struct{})
	// Released last (cleanups run in reverse order): the blocked handler
	// returns, and the goroutines it held end before goleak looks.
	t.Cleanup(func() { close(release) })

	sys := quietSystem()
	ws, err := eventsource.New(pgtest.NewPool(t, 8), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	rt, err := NewRuntime(ctx, sys, ws, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	o := GroupOptions{Subscription: "stuck", Category: "acct", Buckets: 1, Worker: "w",
		Handler: blockingHandler(started, release), Lease: fastLease()}
	g, err := rt.StartGroup(ctx, o)
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(waitLong):
		t.Fatal("the handler never got the event")
	}

	stopCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rt.Stop(stopCtx) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(waitLong):
		t.Fatal("Runtime.Stop did not return after its context ended")
	}
	select {
	case <-g.Done():
	default:
		t.Fatal("the group is not done after Runtime.Stop returned")
	}
	require.True(t, errors.Is(g.Err(), context.DeadlineExceeded), "the group reports why it ended: %v", g.Err())
}
