package supervision_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/supervision"
)

func ExampleClassify() {
	for _, err := range []error{
		&pgconn.PgError{Code: "40P01"}, // deadlock detected
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF),
		fmt.Errorf("checkpoint: %w", eventsource.ErrFenceLost),
		&kumierr.ConfigError{Field: "actors.GroupOptions.Buckets", Value: 0, Reason: "must be at least 1"},
		errors.New("who knows"),
	} {
		c := supervision.Classify(err)
		fmt.Println(c, supervision.DirectiveFor(c))
	}
	// Output:
	// transient RestartDirective
	// transient RestartDirective
	// fence_lost StopDirective
	// config EscalateDirective
	// unknown RestartDirective
}

func ExampleBackoff() {
	b := supervision.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: supervision.NoJitter}
	var delays []time.Duration
	for attempt := 1; attempt <= 6; attempt++ {
		delays = append(delays, b.Next(attempt))
	}
	fmt.Println(delays)
	b.Jitter = supervision.FullJitter
	d := b.Next(3)
	fmt.Println(d >= 0 && d <= b.Ceiling(3))
	// Output:
	// [100ms 200ms 400ms 800ms 1s 1s]
	// true
}

// A custom decider: shutting down is not worth a restart.
func ExampleDecider() {
	decider := supervision.Decider(func(reason any) (supervision.Class, actor.Directive) {
		if errors.Is(supervision.ReasonError(reason), context.Canceled) {
			return supervision.Permanent, actor.StopDirective
		}
		return supervision.DefaultDecider(reason)
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
	strategy, err := supervision.OneForOne(supervision.Options{
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
