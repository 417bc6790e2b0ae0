package actors

// A group's health, as Runtime.Healthy reports it.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kumi-run/kumi/internal/startstop"
)

// HealthError is why [Runtime.Healthy] reports a group unhealthy.
type HealthError struct {
	// Subscription is the group's.
	Subscription string
	// Since is how long ago the last successful lease pass started;
	// Bound the longest that may be (the TTL less the margin).
	Since, Bound time.Duration
	// Err is the last pass's error, or why the group ended.
	Err error
}

// Error says which group, since when, and why.
func (e *HealthError) Error() string {
	if e.Since == 0 {
		return fmt.Sprintf("kumi: subscription %q: group ended: %v", e.Subscription, e.Err)
	}
	return fmt.Sprintf("kumi: subscription %q: no successful lease pass for %v (at most %v): the database is unreachable or too slow: %v",
		e.Subscription, e.Since.Round(time.Millisecond), e.Bound, e.Err)
}

// Unwrap returns the last pass's error, or why the group ended.
func (e *HealthError) Unwrap() error { return e.Err }

// health reports the group unhealthy once it has gone longer than the TTL
// less the margin without a successful lease pass — by then its readers
// have stopped on unsure leases — or when it has ended.
func (g *group) health() error {
	select {
	case <-g.done:
		g.mu.Lock()
		defer g.mu.Unlock()
		err := g.err
		if err == nil {
			err = errors.New("stopped")
		}
		return &HealthError{Subscription: g.opts.Subscription, Err: err}
	default:
	}
	cfg := g.leases.Config()
	bound := cfg.TTL - cfg.Margin
	g.mu.Lock()
	defer g.mu.Unlock()
	if since := time.Since(g.renewedAt); since > bound {
		err := g.passErr
		if err == nil {
			err = errors.New("a pass is still under way")
		}
		return &HealthError{Subscription: g.opts.Subscription, Since: since, Bound: bound, Err: err}
	}
	return nil
}

// Healthy reports whether this process can do its work: nil while every
// group it runs has renewed its leases within the TTL less the margin (so
// it reaches the database and its readers deliver), else a *[HealthError]
// per group that has not, or that ended. A runtime that is stopped is
// unhealthy. It costs no database call: serve it on /healthz
// (observability.HandlerOptions.Healthy).
func (rt *Runtime) Healthy(context.Context) error {
	rt.mu.Lock()
	if st := rt.life.State(); st != startstop.Running {
		rt.mu.Unlock()
		return fmt.Errorf("kumi: runtime is not running (%v)", st)
	}
	groups := make([]*Group, 0, len(rt.groups))
	for g := range rt.groups {
		groups = append(groups, g)
	}
	rt.mu.Unlock()
	var errs []error
	for _, g := range groups {
		errs = append(errs, g.g.health())
	}
	return errors.Join(errs...)
}
