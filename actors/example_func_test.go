package actors_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
)

// A function handler whose writes go to the event store's database makes
// them exactly-once by returning what CommitWithCheckpoint returns: the
// projection's row and the checkpoint commit together, fenced, or not at
// all. examples/exactly-once is the whole program.
func ExampleFunc_commitWithCheckpoint() {
	var store *eventsource.Store // the runtime's store
	project := actors.Func(func(ctx context.Context, d *actors.Delivery) error {
		return actors.CommitWithCheckpoint(ctx, store, d, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE balances SET total = total + 1 WHERE account = $1`, d.Event.Stream)
			return err
		})
	})
	_ = actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 16, Handler: project}
}

// A function handler answers with its error: nil acks, an error retries,
// a permanent one dead-letters at once.
func ExampleFunc() {
	handler := actors.Func(func(ctx context.Context, d *actors.Delivery) error {
		if len(d.Event.Data) > 1<<20 {
			return actors.Permanent(fmt.Errorf("event %s: %d bytes is more than this service takes", d.Event.ID, len(d.Event.Data)))
		}
		if err := callService(ctx, d.Event.Data); err != nil {
			return err // retried under the group's RetryPolicy
		}
		return nil
	})
	_ = actors.GroupOptions{Subscription: "mailer", Category: "order", Buckets: 16, Handler: handler}
}

func callService(context.Context, []byte) error { return nil }

type deposited struct {
	Amount int `json:"amount"`
}

// Typed is a group's Handler that decodes each event's data into a Go type,
// as Func and BatchFunc are Handlers.
func ExampleTyped() {
	_ = actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 16,
		Handler: actors.Typed(func(ctx context.Context, d *actors.Delivery, v deposited) error {
			fmt.Println(d.Event.Stream, "deposited", v.Amount)
			return nil
		})}
}

// TypedFunc decodes each event's data into a Go type; data that does not
// decode is dead-lettered at once, never retried.
func ExampleTypedFunc() {
	handle := actors.TypedFunc(func(ctx context.Context, d *actors.Delivery, v deposited) error {
		fmt.Println(d.Event.Stream, "deposited", v.Amount)
		return nil
	})
	ctx := context.Background()
	_ = handle(ctx, &actors.Delivery{Event: eventsource.RecordedEvent{Stream: "account-42", Type: "Deposited", Data: []byte(`{"amount":10}`)}})
	err := handle(ctx, &actors.Delivery{Event: eventsource.RecordedEvent{Stream: "account-42", Type: "Deposited", Data: []byte(`{"amount":"ten"}`)}})
	var permanent *actors.PermanentError
	fmt.Println("dead-lettered at once:", errors.As(err, &permanent))
	fmt.Println(err)
	// Output:
	// account-42 deposited 10
	// dead-lettered at once: true
	// kumi: decode Deposited event into actors_test.deposited: json: cannot unmarshal string into Go struct field deposited.amount of type int
}

type withdrawn struct {
	Amount int `json:"amount"`
}

// A Router calls a function per event type, each with its own Go type;
// events of other types are acked.
func ExampleRouter() {
	balance := 0
	var r actors.Router
	actors.On(&r, "Deposited", func(ctx context.Context, d *actors.Delivery, v deposited) error {
		balance += v.Amount
		return nil
	})
	actors.On(&r, "Withdrawn", func(ctx context.Context, d *actors.Delivery, v withdrawn) error {
		balance -= v.Amount
		return nil
	})
	ctx := context.Background()
	for _, e := range []eventsource.RecordedEvent{
		{Type: "Opened", Data: []byte(`{}`)},
		{Type: "Deposited", Data: []byte(`{"amount":10}`)},
		{Type: "Withdrawn", Data: []byte(`{"amount":3}`)},
	} {
		if err := r.Handle(ctx, &actors.Delivery{Event: e}); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println("balance", balance)
	_ = actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 16, Handler: r.Props()}
	// Output: balance 7
}

// Run runs a service's subscriptions until its context ends, then stops
// them gracefully: with signal.NotifyContext(ctx, os.Interrupt,
// syscall.SIGTERM) as its context, it is the whole shutdown story.
// examples/quickstart is the whole program.
func ExampleRun() {
	ctx, stop := context.WithCancel(context.Background()) // signal.NotifyContext in a service
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: "example_run"})
	if err != nil {
		panic(err)
	}
	defer pool.Exec(context.Background(), `DROP SCHEMA example_run CASCADE`) //nolint:errcheck

	var handler actors.Router
	actors.On(&handler, "Deposited", func(ctx context.Context, d *actors.Delivery, e deposited) error {
		fmt.Println(d.Event.Stream, "deposited", e.Amount)
		stop() // here, to end the example
		return nil
	})
	err = actors.Run(ctx, store, actors.RunOptions{
		Started: func(*actors.Runtime, []*actors.Group) {
			_, _ = store.Append(ctx, "account-42", eventsource.Any, []eventsource.EventData{
				{Type: "Deposited", Data: []byte(`{"amount":10}`)},
			})
		},
	}, actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 16, Handler: handler.Props()})
	fmt.Println("stopped:", err)
	// Output:
	// account-42 deposited 10
	// stopped: <nil>
}
