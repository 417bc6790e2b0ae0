package kumitest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/kumitest"
)

// Deposited is the data of the examples' events.
type Deposited struct {
	Amount int `json:"amount"`
}

// Given events, when the handler runs, then each event's outcome: a test
// of a handler in memory, with the group's options.
func Example() {
	k, err := kumitest.New(kumitest.Options{Group: actors.GroupOptions{
		Subscription: "balances", Category: "account", Buckets: 4,
		Handler: actors.Typed(func(_ context.Context, d *actors.Delivery, e Deposited) error {
			if e.Amount <= 0 {
				return actors.Permanent(fmt.Errorf("a deposit of %d", e.Amount))
			}
			return nil
		}),
	}})
	if err != nil {
		panic(err)
	}
	defer k.Close()

	res, err := k.Run(context.Background(),
		kumitest.Event{Stream: "account-1", Type: "Deposited", Data: Deposited{Amount: 10}},
		kumitest.Event{Stream: "account-1", Type: "Deposited", Data: Deposited{Amount: -5}},
		kumitest.Event{Stream: "account-2", Type: "Deposited", Data: Deposited{Amount: 3}},
	)
	if err != nil {
		panic(err)
	}
	for _, o := range res.Outcomes {
		fmt.Printf("%s@%d acked=%v dead-letter=%q\n", o.Event.Stream, o.Event.Version, o.Acked, o.DeadLetter)
	}
	// Output:
	// account-1@0 acked=true dead-letter=""
	// account-1@1 acked=false dead-letter="a deposit of -5"
	// account-2@0 acked=true dead-letter=""
}

// Check runs the events once cleanly and then under each fault schedule,
// and compares the handler's effects. A handler that adds every deposit
// it is given is caught: a crash delivers the tail again.
func ExampleKit_Check() {
	k, err := kumitest.New(kumitest.Options{Group: actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 4}})
	if err != nil {
		panic(err)
	}
	defer k.Close()
	var events []kumitest.Event
	for i := range 20 {
		events = append(events, kumitest.Event{Stream: fmt.Sprintf("account-%d", i%3), Type: "Deposited", Data: Deposited{Amount: 1}})
	}

	// A fresh world for each pass: the handler and how to read its effects.
	naive := func() kumitest.World {
		var mu sync.Mutex
		balances := map[string]int{}
		return kumitest.World{
			Handler: actors.Typed(func(_ context.Context, d *actors.Delivery, e Deposited) error {
				mu.Lock()
				defer mu.Unlock()
				balances[d.Event.Stream] += e.Amount
				return nil
			}),
			Effects: func() any { mu.Lock(); defer mu.Unlock(); return fmt.Sprint(balances) },
		}
	}
	err = k.Check(context.Background(), events, naive, kumitest.CheckOptions{})
	var fe *kumitest.FaultError
	if errors.As(err, &fe) {
		fmt.Println("caught by", fe.Fault, "seed", fe.Seed)
	}

	// The same handler made idempotent: it applies each version of a
	// stream once, so a repeat (version 6 again after 7) changes nothing.
	idempotent := func() kumitest.World {
		var mu sync.Mutex
		balances, next := map[string]int{}, map[string]int64{}
		return kumitest.World{
			Handler: actors.Typed(func(_ context.Context, d *actors.Delivery, e Deposited) error {
				mu.Lock()
				defer mu.Unlock()
				if d.Event.Version >= next[d.Event.Stream] {
					balances[d.Event.Stream] += e.Amount
					next[d.Event.Stream] = d.Event.Version + 1
				}
				return nil
			}),
			Effects: func() any { mu.Lock(); defer mu.Unlock(); return fmt.Sprint(balances) },
		}
	}
	fmt.Println("idempotent:", k.Check(context.Background(), events, idempotent, kumitest.CheckOptions{}))
	// Output:
	// caught by crash-tail seed 1
	// idempotent: <nil>
}

// RunFault runs one schedule from one seed, and the result tells what it
// did: here, the events a crash delivered again.
func ExampleKit_RunFault() {
	k, err := kumitest.New(kumitest.Options{Group: actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 1,
		Handler: actors.Func(func(context.Context, *actors.Delivery) error { return nil })}})
	if err != nil {
		panic(err)
	}
	defer k.Close()
	var events []kumitest.Event
	for range 10 {
		events = append(events, kumitest.Event{Stream: "account-1", Type: "Deposited"})
	}
	res, err := k.RunFault(context.Background(), kumitest.CrashTail, 7, events...)
	if err != nil {
		panic(err)
	}
	fmt.Println("events:", len(events), "acked:", res.Acked(), "deliveries:", len(res.Deliveries))
	for _, d := range res.Of(kumitest.CrashTail) {
		fmt.Printf("again: %s@%d (epoch %d)\n", d.Event.Stream, d.Event.Version, d.Epoch)
	}
	// Output:
	// events: 10 acked: 10 deliveries: 17
	// again: account-1@4 (epoch 2)
	// again: account-1@5 (epoch 2)
	// again: account-1@6 (epoch 2)
	// again: account-1@7 (epoch 2)
	// again: account-1@6 (epoch 3)
	// again: account-1@7 (epoch 3)
	// again: account-1@8 (epoch 3)
}
