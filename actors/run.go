package actors

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/observability"
)

// StopTimeoutDefault bounds [Run]'s graceful stop.
const StopTimeoutDefault = 30 * time.Second

// RunOptions configure [Run]. Zero values mean defaults.
type RunOptions struct {
	// Runtime configures the runtime Run starts.
	Runtime RuntimeOptions
	// System is the actor system to run on; nil makes one whose protoactor
	// logs go to Runtime.Logger (or slog's default), dead letters at Debug,
	// and shuts it down when Run returns. A system given here is left
	// running.
	System *actor.ActorSystem
	// StopTimeout bounds the graceful stop once the context ends: readers
	// finish their in-flight events, flush their checkpoints and release
	// their leases within it, or are stopped without waiting further.
	// Default 30 s (StopTimeoutDefault).
	StopTimeout time.Duration
	// Started, if set, is called once every group has started, before Run
	// waits: a place to keep the runtime and groups for a status page.
	Started func(rt *Runtime, groups []*Group)
	// Serve, if not "", is a HOST:PORT on which Run serves, while it runs,
	// GET /metrics (the Prometheus exposition otelsetup.Setup
	// registers), /healthz (the runtime's health, [Runtime.Healthy]) and
	// /status (the groups' ownership, from Runtime.Telemetry or the
	// runtime's own): observability.Handler, with observability.Serve. A
	// port ":0" picks a free one; Serving learns it. A port that cannot be
	// listened on fails Run at once.
	Serve string
	// Serving, if set, is called with the address Serve listens on before
	// the groups start (to print it, say).
	Serving func(addr net.Addr)
}

// ErrGroupEnded is returned by [Run] (wrapped, with the group's own error
// when it has one) when a group ends before Run's context does.
var ErrGroupEnded = errors.New("kumi: a group ended on its own")

// Run runs a service's subscriptions until ctx ends, then stops them
// gracefully: it starts a [Runtime] on store and a [Group] for each of
// groups, waits, and stops the groups (together) and then the runtime,
// within opts.StopTimeout. With [os/signal.NotifyContext] it is the whole
// shutdown story:
//
//	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//	defer stop()
//	err := actors.Run(ctx, store, actors.RunOptions{}, groups...)
//
// Run returns nil after a clean stop on ctx's end, also when ctx ends while
// it starts. It returns at once the
// first error that prevents a start (invalid options, as a
// *[kumierr.ConfigError] naming the field, "actors groups[i].Buckets" for
// a group's; the database), after stopping what it had started. If a
// group ends before ctx does (a failure nothing restarts), Run stops the
// others and returns [ErrGroupEnded] wrapping the group's error. A stop that
// runs out of StopTimeout adds its error (context.DeadlineExceeded).
func Run(ctx context.Context, store *eventsource.Store, opts RunOptions, groups ...GroupOptions) error {
	if opts.StopTimeout == 0 {
		opts.StopTimeout = StopTimeoutDefault
	}
	if opts.StopTimeout < 0 {
		return invalid("RunOptions.StopTimeout", opts.StopTimeout, "must be positive")
	}
	if len(groups) == 0 {
		return &kumierr.ConfigError{Field: "actors groups", Reason: "Run needs at least one GroupOptions"}
	}
	for i, o := range groups {
		var ce *kumierr.ConfigError
		if err := o.WithDefaults().Validate(); errors.As(err, &ce) {
			return &kumierr.ConfigError{Field: fmt.Sprintf("actors groups[%d].%s", i, strings.TrimPrefix(ce.Field, "actors.GroupOptions.")),
				Value: ce.Value, Reason: ce.Reason}
		}
	}
	system := opts.System
	if system == nil {
		system = actor.NewActorSystem(actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(opts.Runtime.Logger)))
		defer system.Shutdown()
	}
	var ln net.Listener
	if opts.Serve != "" {
		var lc net.ListenConfig
		var err error
		if ln, err = lc.Listen(ctx, "tcp", opts.Serve); err != nil {
			return fmt.Errorf("kumi: RunOptions.Serve: %w", err)
		}
		defer func() { _ = ln.Close() }() // when the runtime fails to start; closing twice is harmless
	}
	rt, err := New(system, store, opts.Runtime)
	if err != nil {
		return err
	}
	if err := rt.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // ended while starting: a stop, not a failure
		}
		return err
	}
	if ln != nil {
		defer serve(ctx, ln, rt, opts)()
	}
	stop := func(cause error) error {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.StopTimeout)
		defer cancel()
		err := rt.Stop(stopCtx) // every group, together, then the runtime
		if err != nil && stopCtx.Err() != nil {
			err = fmt.Errorf("kumi: graceful stop within %v: %w", opts.StopTimeout, err)
		}
		return joinDistinct(cause, err)
	}
	started, failed, err := startGroups(ctx, rt, groups)
	if err != nil && ctx.Err() != nil {
		return stop(nil) // ended while starting: a stop, not a failure
	}
	if err != nil {
		return stop(fmt.Errorf("kumi: start groups[%d] (%s): %w", failed, groups[failed].Subscription, err))
	}
	if opts.Started != nil {
		opts.Started(rt, started)
	}
	waiting, cancel := context.WithCancel(ctx)
	defer cancel()
	select {
	case <-ctx.Done():
		return stop(nil)
	case gr := <-firstDone(waiting, started):
		return stop(ended(gr))
	}
}

// groupStarts is how many groups startGroups starts at once. A group's
// start is a few round trips (its worker row, its subscription's rows)
// and its first pass follows on its own: one at a time, a hundred groups
// took 14 s to start under load, and a worker joining late as long to
// take its share.
const groupStarts = 8

// startGroups starts a group on rt for each of groups, groupStarts at a
// time, and returns them in the order of groups. On a failure it starts
// no more, and returns the index and the error of the first that failed
// (the groups it started are rt's: its Stop stops them).
func startGroups(ctx context.Context, rt *Runtime, groups []GroupOptions) (started []*Group, failed int, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]*Group, len(groups))
	var mu sync.Mutex
	failed = -1
	turns := make(chan struct{}, groupStarts)
	var wg sync.WaitGroup
	for i, o := range groups {
		select {
		case turns <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-turns }()
			gr, gerr := rt.StartGroup(ctx, o)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case gerr == nil:
				out[i] = gr
			case failed < 0:
				failed, err = i, gerr
				cancel()
			}
		})
	}
	wg.Wait()
	if failed < 0 && ctx.Err() != nil {
		return nil, 0, ctx.Err() // the caller's context ended
	}
	if failed >= 0 {
		return nil, failed, err
	}
	return out, 0, nil
}

// serve serves rt's /metrics, /healthz and /status on ln until the
// function it returns is called, which waits for the server to end.
func serve(ctx context.Context, ln net.Listener, rt *Runtime, opts RunOptions) (stop func()) {
	if opts.Serving != nil {
		opts.Serving(ln.Addr())
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h := observability.Handler(observability.HandlerOptions{Telemetry: rt.telemetry.t, Healthy: rt.Healthy})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := observability.ServeListener(ctx, ln, h); err != nil && ctx.Err() == nil {
			rt.logger.Warn("kumi: RunOptions.Serve: the HTTP server ended", "addr", ln.Addr().String(), "error", err)
		}
	}()
	return func() { cancel(); <-done }
}

// firstDone returns a channel that receives the first of groups to end;
// its goroutines end with ctx or when a group ends.
func firstDone(ctx context.Context, groups []*Group) <-chan *Group {
	out := make(chan *Group, len(groups))
	for _, gr := range groups {
		go func() {
			select {
			case <-gr.Done():
				out <- gr
			case <-ctx.Done():
			}
		}()
	}
	return out
}

// ended is the error of a group that ended on its own.
func ended(gr *Group) error {
	if err := gr.Err(); err != nil {
		return fmt.Errorf("%w: subscription %s: %w", ErrGroupEnded, gr.g.opts.Subscription, err)
	}
	return fmt.Errorf("%w: subscription %s", ErrGroupEnded, gr.g.opts.Subscription)
}
