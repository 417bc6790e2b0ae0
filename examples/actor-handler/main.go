// Command actor-handler embeds kumi on the actor path: the handler is a
// protoactor-go actor that answers each *actors.Delivery with Ack, Retry or
// DeadLetter, and the program starts and stops the Runtime and Group
// itself. Use it when a handler keeps state between events or answers
// later, from other messages; otherwise examples/quickstart is shorter.
// With -once it appends a deposit itself and exits once it has handled it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/observability"
)

// balances is the handler actor of one bucket: each bucket has its own, so
// its state needs no lock. It keeps the balances of the bucket's accounts
// in memory (a real one would keep them somewhere durable).
type balances struct {
	totals  map[string]int
	handled func(uuid.UUID)
}

// Receive answers each delivery with ctx.Respond; an event that cannot be
// applied is dead-lettered at once, a failure of our own is retried.
func (b *balances) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started: // also after a restart: the state starts over
		b.totals = map[string]int{}
	case *actors.Delivery:
		if m.Event.Type != "Deposited" {
			ctx.Respond(actors.Ack{}) // not ours
			return
		}
		var e struct {
			Amount int `json:"amount"`
		}
		if err := json.Unmarshal(m.Event.Data, &e); err != nil {
			ctx.Respond(actors.DeadLetter{Reason: "bad Deposited event: " + err.Error()})
			return
		}
		if e.Amount <= 0 {
			ctx.Respond(actors.Retry{After: time.Second, Reason: "a deposit of nothing: maybe a later version of this service knows"})
			return
		}
		b.totals[m.Event.Stream] += e.Amount
		fmt.Printf("%s deposited %d, balance %d (bucket %d)\n", m.Event.Stream, e.Amount, b.totals[m.Event.Stream], m.Bucket)
		ctx.Respond(actors.Ack{})
		b.handled(m.Event.ID)
	}
}

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
	// The logger factory keeps protoactor-go from logging every dead
	// letter at Info.
	system := actor.NewActorSystem(actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(nil)))
	defer system.Shutdown()

	rt, err := actors.New(system, store, actors.RuntimeOptions{})
	if err != nil {
		return err
	}
	if err := rt.Start(ctx); err != nil { // migrates, starts the publisher
		return err
	}
	var mine uuid.UUID // the deposit -once appends
	if once {
		res, err := store.Append(ctx, "account-42", eventsource.Any, []eventsource.EventData{
			{Type: "Deposited", Data: []byte(`{"amount":10}`)},
		})
		if err != nil {
			return errors.Join(err, rt.Stop(ctx))
		}
		mine = res.IDs[0]
	}
	ctx, done := context.WithCancel(ctx)
	defer done()
	handled := func(id uuid.UUID) {
		if id == mine {
			done() // -once: handled; stop
		}
	}

	group, err := rt.StartGroup(ctx, actors.GroupOptions{
		Subscription: "balances-actor",
		Category:     "account",
		Buckets:      16,
		Handler:      actor.PropsFromProducer(func() actor.Actor { return &balances{handled: handled} }),
	})
	if err != nil {
		return errors.Join(err, rt.Stop(ctx))
	}
	var ended error
	select {
	case <-ctx.Done():
	case <-group.Done(): // a failure nothing restarts
		ended = fmt.Errorf("group %s ended on its own", "balances-actor")
	}
	// The graceful stop: readers finish their in-flight events and write
	// their checkpoints, then the leases are released, within 30 s.
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(ended, group.Stop(stopCtx), rt.Stop(stopCtx))
}
