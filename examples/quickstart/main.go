// Command quickstart embeds kumi: one subscription with a typed function
// handler, run until SIGINT or SIGTERM, then stopped gracefully. Start it N
// times and the processes share the subscription's 16 buckets. With -once
// it appends a deposit itself and exits once the deposit is handled, by
// this copy or by another that holds its bucket (once.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
)

// Deposited is the data of an account's "Deposited" event.
type Deposited struct {
	Amount int `json:"amount"`
}

func main() {
	once := flag.Bool("once", false, "append a deposit to account-42, handle it, and exit")
	flag.Parse()
	if err := run(*once); err != nil {
		log.Fatal(err)
	}
}

func run(once bool) error {
	// SIGINT or SIGTERM ends ctx; Run then finishes the events in flight,
	// writes the checkpoints and releases the leases before it returns.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: "kumi"})
	if err != nil {
		return err
	}

	ctx, done := context.WithCancel(ctx)
	defer done()
	if once {
		if err := actors.Migrate(ctx, store); err != nil { // Run migrates too, but we append first
			return err
		}
		res, err := store.Append(ctx, "account-42", eventsource.Any, []eventsource.EventData{
			{Type: "Deposited", Data: []byte(`{"amount":10}`)},
		})
		if err != nil {
			return err
		}
		go func() { // -once: stop once the deposit is handled, here or by another copy
			if waitHandled(ctx, store, "balances", "account-42", res.LastVersion) == nil {
				done()
			}
		}()
	}

	return actors.Run(ctx, store, actors.RunOptions{}, actors.GroupOptions{
		Subscription: "balances",
		Category:     "account",
		Buckets:      16,
		Handler:      handler(os.Stdout).Props(),
	})
}

// handler has one function per event type, its data decoded from JSON;
// events of other types are acked. A returned error retries the event,
// actors.Permanent(err) dead-letters it at once. main_test.go tests it
// with kumitest.
func handler(out io.Writer) *actors.Router {
	var h actors.Router
	actors.On(&h, "Deposited", func(ctx context.Context, d *actors.Delivery, e Deposited) error {
		fmt.Fprintf(out, "%s deposited %d\n", d.Event.Stream, e.Amount)
		return nil
	})
	return &h
}
