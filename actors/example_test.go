package actors_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/observability"
)

// A service embeds kumi: a handler actor, a runtime per process, a group
// per subscription. Start the same program N times and the workers share
// the buckets.
func ExampleRuntime() {
	ctx := context.Background()
	handled := make(chan string, 1)

	// A handler actor: answer each *actors.Delivery with Ack, Retry or DeadLetter.
	handler := actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*actors.Delivery); ok {
			handled <- fmt.Sprintf("handled %s version %d", d.Event.Stream, d.Event.Version)
			ctx.Respond(actors.Ack{})
		}
	})

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: "example_runtime"})
	defer pool.Exec(ctx, `DROP SCHEMA example_runtime CASCADE`) //nolint:errcheck
	system := actor.NewActorSystem(actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(nil)))

	rt, err := actors.New(system, store, actors.RuntimeOptions{})
	if err != nil {
		panic(err)
	}
	if err := rt.Start(ctx); err != nil { // migrates, starts the publisher
		panic(err)
	}
	group, err := rt.StartGroup(ctx, actors.GroupOptions{
		Subscription: "balances",
		Category:     "account",
		Buckets:      16,
		Handler:      handler,
	})
	if err != nil {
		panic(err)
	}
	_, _ = store.Append(ctx, "account-42", eventsource.Any, []eventsource.EventData{
		{Type: "Deposited", Data: []byte(`{"amount":10}`)},
	})
	fmt.Println(<-handled)

	// On shutdown: finish in-flight events, flush checkpoints, release leases.
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = group.Stop(stopCtx)
	_ = rt.Stop(stopCtx)
	// Output: handled account-42 version 0
}

// A handler whose writes go to the same database commits them with the
// checkpoint, fenced: exactly-once for projections.
func ExampleCommitWithCheckpoint() {
	var store *eventsource.Store // the runtime's store
	handler := actor.PropsFromFunc(func(ctx actor.Context) {
		d, ok := ctx.Message().(*actors.Delivery)
		if !ok {
			return
		}
		err := actors.CommitWithCheckpoint(d.Context, store, d, func(c context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(c, `UPDATE balances SET total = total + 1 WHERE account = $1`, d.Event.Stream)
			return err
		})
		switch {
		case err == nil, errors.Is(err, actors.ErrAlreadyCommitted):
			ctx.Respond(actors.Ack{Committed: true}) // committed now, or by an earlier attempt
		case errors.Is(err, eventsource.ErrFenceLost):
			ctx.Respond(actors.Ack{}) // this worker lost the bucket: the new owner redoes the event
		default:
			ctx.Respond(actors.Retry{After: time.Second, Reason: err.Error()})
		}
	})
	_ = handler
}
