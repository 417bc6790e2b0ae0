// Command exactly-once keeps a projection — a table of account balances —
// in the event store's database, exactly once: each event's update commits
// in one transaction with the subscription's checkpoint, fenced by the
// bucket's lease, so a retry, a crash or a takeover never applies an event
// twice. With -once it appends a deposit itself and exits once it has
// handled it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
)

// Deposited is the data of an account's "Deposited" event.
type Deposited struct {
	Amount int `json:"amount"`
}

const createTable = `CREATE TABLE IF NOT EXISTS account_balances (
	account text PRIMARY KEY,
	total   bigint NOT NULL
)`

const applyDeposit = `INSERT INTO account_balances AS b (account, total) VALUES ($1, $2)
ON CONFLICT (account) DO UPDATE SET total = b.total + excluded.total
RETURNING total`

func main() {
	once := flag.Bool("once", false, "append a deposit to account-42, handle it, and exit")
	flag.Parse()
	if err := run(*once); err != nil {
		log.Fatal(err)
	}
}

func run(once bool) error {
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
	if err := actors.Migrate(ctx, store); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, createTable); err != nil {
		return err
	}

	var mine uuid.UUID // the deposit -once appends
	if once {
		res, err := store.Append(ctx, "account-42", eventsource.Any, []eventsource.EventData{
			{Type: "Deposited", Data: []byte(`{"amount":10}`)},
		})
		if err != nil {
			return err
		}
		mine = res.IDs[0]
	}
	ctx, done := context.WithCancel(ctx)
	defer done()

	handler := projection(store, func(d *actors.Delivery, e Deposited, total int64) {
		fmt.Printf("%s deposited %d, balance %d\n", d.Event.Stream, e.Amount, total)
		if d.Event.ID == mine {
			done() // -once: applied; stop
		}
	})
	return actors.Run(ctx, store, actors.RunOptions{}, actors.GroupOptions{
		Subscription: "balances-projection",
		Category:     "account",
		Buckets:      16,
		Handler:      handler.Props(),
	})
}

// projection is the handler: it applies each deposit to account_balances
// with the subscription's checkpoint, in one fenced transaction, and then
// tells applied the new balance. main_test.go tests it with kumitest,
// under every fault schedule.
func projection(store *eventsource.Store, applied func(d *actors.Delivery, e Deposited, total int64)) *actors.Router {
	var handler actors.Router
	actors.On(&handler, "Deposited", func(ctx context.Context, d *actors.Delivery, e Deposited) error {
		var total int64
		// The update and the checkpoint commit together, or not at all.
		err := actors.CommitWithCheckpoint(ctx, store, d, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, applyDeposit, d.Event.Stream, e.Amount).Scan(&total)
		})
		if err != nil {
			return err // retried; a lost fence acks (the bucket's new owner applies it)
		}
		applied(d, e, total)
		return nil
	})
	return &handler
}
