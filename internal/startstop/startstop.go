// Package startstop is kumi's one implementation of the lifecycle contract
// every long-lived service follows (docs/design/architecture.md, "Lifecycle"):
//
//	Start(ctx context.Context) error
//	Stop(ctx context.Context) error
//
// A service holds a [Lifecycle] and calls it from its own Start and Stop.
// Package startstoptest checks a service against the contract.
package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kumi-run/kumi/kumierr"
)

// Service is the shape of every long-lived kumi service.
type Service interface {
	// Start starts the service. ctx bounds starting only.
	Start(ctx context.Context) error
	// Stop stops the service and waits for it, at most until ctx ends.
	Stop(ctx context.Context) error
}

// ErrStopped is returned by Start once Stop has been called: a stopped
// service never starts again (make a new one). It is kumierr.ErrStopped,
// the name users test for.
var ErrStopped = kumierr.ErrStopped

// State is where a service is in its life.
type State int

// The states, in the order a service goes through them. A failed start
// goes back to New.
const (
	New State = iota
	Starting
	Running
	Stopping
	Stopped
)

var stateNames = [...]string{"new", "starting", "running", "stopping", "stopped"}

// String returns the state's name.
func (s State) String() string {
	if s < 0 || int(s) >= len(stateNames) {
		return fmt.Sprintf("State(%d)", int(s))
	}
	return stateNames[s]
}

// Lifecycle implements the contract for the service that holds it. Its
// zero value is a new service. A service's Start is
//
//	func (s *S) Start(ctx context.Context) error { return s.life.Start(ctx, s.start) }
//
// and its Stop
//
//	func (s *S) Stop(ctx context.Context) error { return s.life.Stop(ctx, s.halt) }
//
// Start and Stop are safe from any number of goroutines: starts and stops
// take turns (a call waiting for its turn gives up when its ctx ends), and
// a Stop cancels the ctx of a start under way.
type Lifecycle struct {
	turn     chan struct{} // capacity 1: held by the Start or Stop under way
	turnOnce sync.Once

	mu          sync.Mutex
	state       State
	stopAsked   bool
	cancelStart context.CancelFunc // ends the ctx of a start under way
	life        context.Context    // the service's own context: ends when Stop begins
	endLife     context.CancelFunc
	goroutines  sync.WaitGroup
	err         error // the final Stop's result
}

func (l *Lifecycle) acquire(ctx context.Context) error {
	l.turnOnce.Do(func() { l.turn = make(chan struct{}, 1) })
	select {
	case l.turn <- struct{}{}: // a free turn is taken whatever ctx says
		return nil
	default:
	}
	select {
	case l.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *Lifecycle) release() { <-l.turn }

// State returns the service's state.
func (l *Lifecycle) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Start starts the service by calling start once, unless it runs already
// (then it returns nil) or Stop was called (then it returns [ErrStopped]).
// start gets a context that ends with ctx or when a Stop comes while it
// runs; it must return once what it started runs, or, failing, having
// undone what it did: the service is then New again and may be started
// anew. What runs must not depend on that context: goroutines started with
// [Lifecycle.Go] get the service's own.
func (l *Lifecycle) Start(ctx context.Context, start func(ctx context.Context) error) error {
	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
	l.mu.Lock()
	switch {
	case l.stopAsked:
		l.mu.Unlock()
		return ErrStopped
	case l.state == Running:
		l.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return err
	}
	startCtx, cancel := context.WithCancel(ctx)
	l.state, l.cancelStart = Starting, cancel
	// The service's life carries ctx's values, not its end.
	l.life, l.endLife = context.WithCancel(context.WithoutCancel(ctx))
	l.mu.Unlock()

	err := start(startCtx)
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancelStart = nil
	if err != nil {
		l.endLife()
		l.state = New
		if l.stopAsked {
			return errors.Join(ErrStopped, err)
		}
		return err
	}
	l.state = Running // a Stop that came meanwhile stops it next
	return nil
}

// Go runs f on a goroutine of the service, with the service's own
// context, which ends when Stop begins; Stop waits for f to return. Call
// it only from the start function.
func (l *Lifecycle) Go(f func(ctx context.Context)) {
	l.mu.Lock()
	life := l.life
	l.mu.Unlock()
	l.goroutines.Go(func() { f(life) })
}

// Stop stops the service: once it has started, it calls halt (which may
// be nil), then ends the service's context and waits for the goroutines of
// [Lifecycle.Go]. It returns halt's error, or ctx.Err() when ctx ended
// before the service stopped: then a later Stop calls halt again and
// waits once more. Once a Stop has finished in time, every later Stop
// returns its result at once. Stop before Start returns nil, and the
// service can no longer start; Stop during a start cancels it.
func (l *Lifecycle) Stop(ctx context.Context, halt func(ctx context.Context) error) error {
	l.mu.Lock()
	l.stopAsked = true
	if l.cancelStart != nil {
		l.cancelStart()
	}
	switch l.state {
	case New:
		l.state = Stopped
		l.mu.Unlock()
		return nil
	case Stopped:
		err := l.err
		l.mu.Unlock()
		return err
	}
	l.mu.Unlock()

	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
	l.mu.Lock()
	switch l.state {
	case New: // its start failed meanwhile
		l.state = Stopped
		l.mu.Unlock()
		return nil
	case Stopped:
		err := l.err
		l.mu.Unlock()
		return err
	}
	l.state = Stopping
	l.mu.Unlock()

	var err error
	if halt != nil {
		err = halt(ctx)
	}
	l.endLife()
	if err == nil {
		err = l.wait(ctx)
	}
	if err != nil && ctx.Err() != nil {
		return err // out of time: the next Stop waits again
	}
	l.mu.Lock()
	l.state, l.err = Stopped, err
	l.mu.Unlock()
	return err
}

// wait waits for the goroutines of Go, or for ctx to end.
func (l *Lifecycle) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { l.goroutines.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
