// Package startstoptest checks a service against kumi's lifecycle
// contract (docs/design/architecture.md, "Lifecycle"). Every service's package
// tests run [Stress] on it, with goleak on in their TestMain.
package startstoptest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/startstop"
)

// Goroutines is how many goroutines start and stop one service at once.
const Goroutines = 8

// deadline bounds each call of the checks: a call that takes longer is a
// hang, not slowness.
const deadline = time.Minute

// Stress checks the contract on services made by newService (a new,
// never started one per call; it may register cleanups on t):
//   - Stop before Start returns nil, and so does a second Stop; Start then
//     returns startstop.ErrStopped;
//   - Start with an ended context fails with that context's error and
//     leaves the service startable;
//   - Start on a running service returns nil; Stop twice returns nil both
//     times; Start after Stop returns ErrStopped;
//   - many goroutines at once, each starting and stopping the same
//     service several times, get nil or ErrStopped from Start and nil from
//     Stop; and the service ends stopped.
//
// The package's goleak check then shows that every stop ended the
// service's goroutines.
func Stress(t *testing.T, newService func(t *testing.T) startstop.Service) {
	t.Helper()
	call := func(f func(context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		return f(ctx)
	}
	t.Run("stop before start", func(t *testing.T) {
		s := newService(t)
		requireNil(t, "first Stop", call(s.Stop))
		requireNil(t, "second Stop", call(s.Stop))
		requireStopped(t, call(s.Start))
	})
	t.Run("start with an ended context", func(t *testing.T) {
		s := newService(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Start(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Start with a cancelled context: got %v, want context.Canceled", err)
		}
		requireNil(t, "Start after a failed start", call(s.Start))
		requireNil(t, "Stop", call(s.Stop))
	})
	t.Run("start twice, stop twice", func(t *testing.T) {
		s := newService(t)
		requireNil(t, "first Start", call(s.Start))
		requireNil(t, "second Start", call(s.Start))
		requireNil(t, "first Stop", call(s.Stop))
		requireNil(t, "second Stop", call(s.Stop))
		requireStopped(t, call(s.Start))
	})
	t.Run("many goroutines", func(t *testing.T) {
		s := newService(t)
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		gate := make(chan struct{})
		for i := range Goroutines {
			wg.Go(func() {
				<-gate
				for j := range 3 {
					// Half the goroutines stop first, so stops race starts
					// from the first call on.
					if (i+j)%2 == 0 {
						if err := call(s.Start); err != nil && !errors.Is(err, startstop.ErrStopped) {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
						}
					}
					if err := call(s.Stop); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			})
		}
		close(gate)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("concurrent Start and Stop: %v", err)
		}
		requireNil(t, "a last Stop", call(s.Stop))
		requireStopped(t, call(s.Start))
	})
}

func requireNil(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func requireStopped(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, startstop.ErrStopped) {
		t.Fatalf("Start after Stop: got %v, want startstop.ErrStopped", err)
	}
}
