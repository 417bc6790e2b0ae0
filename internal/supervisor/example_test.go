package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/supervisor"
	"github.com/kumi-run/kumi/supervision"
)

// A custom decider: shutting down is not worth a restart.
func ExampleDecider() {
	decider := supervisor.Decider(func(reason any) (supervision.Class, actor.Directive) {
		if errors.Is(supervisor.ReasonError(reason), context.Canceled) {
			return supervision.Permanent, actor.StopDirective
		}
		return supervisor.DefaultDecider(reason)
	})
	fmt.Println(decider(context.Canceled))
	fmt.Println(decider(&pgconn.PgError{Code: "57P01"}))
	// Output:
	// permanent StopDirective
	// transient RestartDirective
}

// A parent supervises its child one-for-one: a transient database error
// restarts the child after a backoff, a lost fence stops it.
func ExampleOneForOne() {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler) // protoactor logs every recovery at Info
	}))
	defer sys.Shutdown()

	decisions := make(chan supervision.Decision, 4)
	strategy, err := supervisor.OneForOne(supervisor.Options{
		MaxRestarts: 5,
		Window:      time.Minute,
		Backoff:     supervision.Backoff{Initial: 10 * time.Millisecond, Max: time.Second},
		Observer: supervision.Observers(
			supervision.LogObserver(nil), // Debug logs, for operators
			supervision.ObserverFunc(func(d supervision.Decision) { decisions <- d }),
		),
	})
	if err != nil {
		panic(err)
	}
	defer strategy.Close()

	started := make(chan *actor.PID, 4)
	reader := actor.PropsFromFunc(func(ctx actor.Context) {
		switch msg := ctx.Message().(type) {
		case *actor.Started:
			started <- ctx.Self()
		case error:
			panic(msg) // a BucketReader fails by panicking with the error
		}
	})
	stopped := make(chan struct{})
	coordinator := actor.PropsFromFunc(func(ctx actor.Context) {
		switch ctx.Message().(type) {
		case *actor.Started:
			ctx.Spawn(reader)
		case *actor.Terminated:
			close(stopped)
		}
	}, actor.WithSupervisor(strategy))
	pid := sys.Root.Spawn(coordinator)
	defer func() { _ = sys.Root.StopFuture(pid).Wait() }()

	child := <-started
	sys.Root.Send(child, error(&pgconn.PgError{Code: "40001"}))
	d := <-decisions
	fmt.Println(d.Class, d.Directive, "attempt", d.Attempt, "within backoff:", d.Delay <= 10*time.Millisecond)
	<-started // restarted

	sys.Root.Send(child, fmt.Errorf("renew: %w", eventsource.ErrFenceLost))
	d = <-decisions
	fmt.Println(d.Class, d.Directive)
	<-stopped
	// Output:
	// transient RestartDirective attempt 1 within backoff: true
	// fence_lost StopDirective
}
