package startstop_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/leaktest"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/internal/startstop/startstoptest"
	"github.com/kumi-run/kumi/kumierr"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// ticker is a service with a goroutine of its own, and hooks to hold its
// start and its halt.
type ticker struct {
	life     startstop.Lifecycle
	starting chan struct{} // nil: starts at once; else closed when start begins
	hold     chan struct{} // nil: nothing held; else start and halt wait for it
	haltErr  error
	ticks    chan struct{}
}

func (s *ticker) Start(ctx context.Context) error {
	return s.life.Start(ctx, func(ctx context.Context) error {
		if s.starting != nil {
			close(s.starting)
			select {
			case <-s.hold:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		s.life.Go(func(life context.Context) {
			for {
				select {
				case <-life.Done():
					return
				case s.ticks <- struct{}{}:
				}
			}
		})
		return nil
	})
}

func (s *ticker) Stop(ctx context.Context) error {
	return s.life.Stop(ctx, func(ctx context.Context) error {
		if s.hold != nil {
			select {
			case <-s.hold:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return s.haltErr
	})
}

func newTicker() *ticker { return &ticker{ticks: make(chan struct{})} }

func TestStress(t *testing.T) {
	startstoptest.Stress(t, func(*testing.T) startstop.Service { return newTicker() })
}

// The service's goroutines live on after Start's ctx ends: it bounds the
// start only.
func TestStartContextBoundsTheStartOnly(t *testing.T) {
	s := newTicker()
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, s.Start(ctx))
	cancel()
	for range 3 {
		<-s.ticks // still running
	}
	require.Equal(t, startstop.Running, s.life.State())
	require.NoError(t, s.Stop(context.Background()))
	require.Equal(t, startstop.Stopped, s.life.State())
}

// A Stop during a start cancels it: Start returns ErrStopped, the service
// is stopped, nothing runs.
func TestStopCancelsAStartUnderWay(t *testing.T) {
	s := newTicker()
	s.starting, s.hold = make(chan struct{}), make(chan struct{}) // hold is never released
	started := make(chan error, 1)
	go func() { started <- s.Start(context.Background()) }()
	<-s.starting
	require.NoError(t, s.Stop(context.Background()))
	err := <-started
	require.ErrorIs(t, err, startstop.ErrStopped)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, startstop.Stopped, s.life.State())
	require.ErrorIs(t, s.Start(context.Background()), startstop.ErrStopped)
	require.ErrorIs(t, s.Start(context.Background()), kumierr.ErrStopped, "the error users test for is kumierr's")
}

// A Stop whose ctx ends first returns ctx.Err(); the next Stop waits once
// more, and its result is every later Stop's.
func TestAStopOutOfTimeIsWaitedForAgain(t *testing.T) {
	s := newTicker()
	require.NoError(t, s.Start(context.Background()))
	s.hold, s.haltErr = make(chan struct{}), errors.New("halt failed")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Stop(ctx), context.Canceled)
	require.Equal(t, startstop.Stopping, s.life.State())
	require.ErrorIs(t, s.Start(context.Background()), startstop.ErrStopped)
	close(s.hold)
	require.ErrorIs(t, s.Stop(context.Background()), s.haltErr)
	require.Equal(t, startstop.Stopped, s.life.State())
	require.ErrorIs(t, s.Stop(ctx), s.haltErr) // at once, whatever its ctx
}

// A failed start leaves the service new: it can start again.
func TestAFailedStartLeavesItNew(t *testing.T) {
	var l startstop.Lifecycle
	boom := errors.New("boom")
	require.ErrorIs(t, l.Start(context.Background(), func(context.Context) error { return boom }), boom)
	require.Equal(t, startstop.New, l.State())
	require.NoError(t, l.Start(context.Background(), func(context.Context) error { return nil }))
	require.Equal(t, startstop.Running, l.State())
	require.NoError(t, l.Stop(context.Background(), nil))
}
