package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/kumitest"
)

// The actor answers a deposit with an ack, another type with an ack, bad
// data with a dead letter at once, and a deposit of nothing with a Retry
// after 1 s until the retry budget is spent: on the kit's simulated clock,
// in no time.
func TestTheActorWithTheKit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var handled []uuid.UUID
	k, err := kumitest.New(kumitest.Options{Group: actors.GroupOptions{
		Subscription: "balances-actor", Category: "account", Buckets: 16,
		Handler: actor.PropsFromProducer(func() actor.Actor {
			return &balances{handled: func(id uuid.UUID) { mu.Lock(); handled = append(handled, id); mu.Unlock() }}
		}),
	}})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	start := time.Now()
	res, err := k.Run(context.Background(),
		kumitest.Event{Stream: "account-42", Type: "Deposited", Data: map[string]int{"amount": 10}},
		kumitest.Event{Stream: "account-42", Type: "Withdrawn", Data: map[string]int{"amount": 3}},
		kumitest.Event{Stream: "account-7", Type: "Deposited", Data: []byte(`{"amount":`)},
		kumitest.Event{Stream: "account-8", Type: "Deposited", Data: map[string]int{"amount": 0}},
		kumitest.Event{Stream: "account-42", Type: "Deposited", Data: map[string]int{"amount": 5}},
	)
	require.NoError(t, err)
	require.Less(t, time.Since(start), time.Second, "the retries' waits are simulated")
	require.Equal(t, 3, res.Acked())
	require.Contains(t, res.Outcomes[2].DeadLetter, "bad Deposited event")
	require.Equal(t, 1, res.Outcomes[2].Attempts)
	nothing := res.Outcomes[3]
	require.Equal(t, actors.MaxAttemptsDefault, nothing.Attempts)
	require.Contains(t, nothing.DeadLetter, "retry budget of 5 attempts spent; last: a deposit of nothing")
	require.GreaterOrEqual(t, res.Elapsed, 4*time.Second, "four retries, each after Retry.After of 1 s at least")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []uuid.UUID{res.Outcomes[0].Event.ID, res.Outcomes[4].Event.ID}, handled)
}
