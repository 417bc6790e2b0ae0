package kumitest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/kumitest"
	"github.com/kumi-run/kumi/supervision"
)

type deposited struct {
	Amount int `json:"amount"`
}

// newKit is a kit for a group of category "account" with handler h.
func newKit(t *testing.T, g actors.GroupOptions) *kumitest.Kit {
	t.Helper()
	if g.Subscription == "" {
		g.Subscription = "balances"
	}
	if g.Category == "" {
		g.Category = "account"
	}
	if g.Buckets == 0 {
		g.Buckets = 4
	}
	k, err := kumitest.New(kumitest.Options{Group: g})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	return k
}

// deposits is n deposits of 1 to accounts streams.
func deposits(n, accounts int) []kumitest.Event {
	evs := make([]kumitest.Event, n)
	for i := range evs {
		evs[i] = kumitest.Event{Stream: fmt.Sprintf("account-%d", i%accounts), Type: "Deposited", Data: deposited{Amount: 1}}
	}
	return evs
}

func TestGivenWhenThen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AHundredEventsRunInMilliseconds", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		seen := map[string][]int64{}
		k := newKit(t, actors.GroupOptions{Handler: actors.Typed(func(_ context.Context, d *actors.Delivery, e deposited) error {
			mu.Lock()
			defer mu.Unlock()
			seen[d.Event.Stream] = append(seen[d.Event.Stream], d.Event.Version)
			return nil
		})})
		start := time.Now()
		res, err := k.Run(ctx, deposits(100, 7)...)
		require.NoError(t, err)
		t.Logf("100 events in %v", time.Since(start))
		require.Equal(t, 100, res.Acked())
		require.Len(t, res.Deliveries, 100)
		for stream, versions := range seen {
			for i, v := range versions {
				require.EqualValues(t, i, v, "stream %s in order", stream)
			}
		}
		require.Zero(t, res.Elapsed, "no retry: no simulated time")
	})

	t.Run("RetriesFollowTheRetryPolicyOnSimulatedTimeThenDeadLetter", func(t *testing.T) {
		t.Parallel()
		k := newKit(t, actors.GroupOptions{Buckets: 1, Retry: actors.RetryPolicy{MaxAttempts: 3,
			Backoff: supervision.Backoff{Initial: time.Second, Max: time.Minute, Jitter: supervision.NoJitter}},
			Handler: actors.Func(func(_ context.Context, d *actors.Delivery) error {
				if d.Event.Stream == "account-bad" {
					return errors.New("the ledger is closed")
				}
				return nil
			})})
		res, err := k.Run(ctx, kumitest.Event{Stream: "account-bad", Type: "Deposited"}, kumitest.Event{Stream: "account-1", Type: "Deposited"})
		require.NoError(t, err)
		bad := res.Outcomes[0]
		require.False(t, bad.Acked)
		require.Equal(t, 3, bad.Attempts)
		require.Equal(t, "retry budget of 3 attempts spent; last: the ledger is closed", bad.DeadLetter)
		require.True(t, res.Outcomes[1].Acked, "the bucket goes on after the dead letter")
		require.Equal(t, 2, res.Retries())
		require.Equal(t, 3*time.Second, res.Elapsed, "backoffs of 1 s and 2 s on the simulated clock")
	})

	t.Run("APermanentErrorAndUndecodableDataDeadLetterAtOnce", func(t *testing.T) {
		t.Parallel()
		k := newKit(t, actors.GroupOptions{Handler: actors.Typed(func(_ context.Context, d *actors.Delivery, e deposited) error {
			if e.Amount < 0 {
				return actors.Permanent(errors.New("a negative deposit"))
			}
			return nil
		})})
		res, err := k.Run(ctx, kumitest.Event{Stream: "account-1", Type: "Deposited", Data: deposited{Amount: -1}},
			kumitest.Event{Stream: "account-2", Type: "Deposited", Data: []byte(`{"amount":"ten"}`)})
		require.NoError(t, err)
		require.Equal(t, "a negative deposit", res.Outcomes[0].DeadLetter)
		require.Equal(t, 1, res.Outcomes[0].Attempts)
		require.Contains(t, res.Outcomes[1].DeadLetter, "decode Deposited event into kumitest_test.deposited")
	})

	t.Run("APanicIsARetry", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		calls := 0
		k := newKit(t, actors.GroupOptions{Handler: actors.Func(func(context.Context, *actors.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			if calls++; calls == 1 {
				panic("boom")
			}
			return nil
		})})
		res, err := k.Run(ctx, deposits(1, 1)...)
		require.NoError(t, err)
		require.True(t, res.Outcomes[0].Acked)
		require.Equal(t, 2, res.Outcomes[0].Attempts)
		require.Equal(t, "panic", string(res.Deliveries[0].Outcome))
		require.Contains(t, res.Deliveries[0].Reason, "handler panicked: boom")
	})

	// An actor handler that panics is restarted by its supervisor, as in a
	// group, and answers the retry.
	t.Run("AnActorHandlerThatPanicsIsRestartedAndRetried", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		starts, calls := 0, 0
		k := newKit(t, actors.GroupOptions{Handler: actor.PropsFromFunc(func(c actor.Context) {
			mu.Lock()
			defer mu.Unlock()
			switch c.Message().(type) {
			case *actor.Started:
				starts++
			case *actors.Delivery:
				if calls++; calls == 1 {
					panic("boom")
				}
				c.Respond(actors.Ack{})
			}
		})})
		res, err := k.Run(ctx, deposits(1, 1)...)
		require.NoError(t, err)
		require.True(t, res.Outcomes[0].Acked)
		require.Equal(t, "panic", string(res.Deliveries[0].Outcome))
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, 2, starts, "restarted once")
	})

	t.Run("AHandlerThatNeverAnswersTimesOutOnTheSimulatedClock", func(t *testing.T) {
		t.Parallel()
		k, err := kumitest.New(kumitest.Options{AnswerWait: 20 * time.Millisecond, Group: actors.GroupOptions{
			Subscription: "s", Category: "account", Buckets: 1, HandlerTimeout: time.Minute, Retry: actors.RetryPolicy{MaxAttempts: 2},
			Handler: actor.PropsFromFunc(func(actor.Context) {}), // answers nothing
		}})
		require.NoError(t, err)
		t.Cleanup(k.Close)
		res, err := k.Run(ctx, deposits(1, 1)...)
		require.NoError(t, err)
		require.Contains(t, res.Outcomes[0].DeadLetter, "no answer within 1m0s")
		require.Equal(t, "timeout", string(res.Deliveries[0].Outcome))
		require.GreaterOrEqual(t, res.Elapsed, 2*time.Minute)
	})

	t.Run("BatchesAreDeliveredAsBatches", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		var sizes []int
		k := newKit(t, actors.GroupOptions{Buckets: 1, Batch: actors.BatchOptions{MaxEvents: 10},
			Handler: actors.BatchFunc(func(_ context.Context, b *actors.Batch) error {
				mu.Lock()
				defer mu.Unlock()
				sizes = append(sizes, len(b.Events))
				return nil
			})})
		res, err := k.Run(ctx, deposits(25, 3)...)
		require.NoError(t, err)
		require.Equal(t, 25, res.Acked())
		require.Equal(t, []int{10, 10, 5}, sizes)
	})

	t.Run("InvalidOptionsAndEventsAreRefusedNamingTheField", func(t *testing.T) {
		t.Parallel()
		_, err := kumitest.New(kumitest.Options{Group: actors.GroupOptions{Subscription: "s", Category: "account"}})
		var ce *kumierr.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "actors.GroupOptions.Buckets", ce.Field)
		noHandler, err := kumitest.New(kumitest.Options{Group: actors.GroupOptions{Subscription: "s", Category: "account", Buckets: 1}})
		require.NoError(t, err, "Check may take the handler from each World")
		t.Cleanup(noHandler.Close)
		_, err = noHandler.Run(ctx, deposits(1, 1)...)
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "kumitest.Options.Group.Handler", ce.Field)
		k := newKit(t, actors.GroupOptions{Handler: actors.Func(func(context.Context, *actors.Delivery) error { return nil })})
		_, err = k.Run(ctx, kumitest.Event{Stream: "order-1", Type: "Placed"})
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "kumitest.Event[0].Stream", ce.Field)
		_, err = k.RunFault(ctx, "earthquake", 1, deposits(1, 1)...)
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "kumitest.Fault", ce.Field)
	})
}

// An actor that answers later, from another message — here the delivery
// it sent itself — answers through Delivery.Respond, as in a group.
func TestAnActorThatAnswersLater(t *testing.T) {
	t.Parallel()
	type later struct{ d *actors.Delivery }
	k := newKit(t, actors.GroupOptions{Handler: actor.PropsFromProducer(func() actor.Actor {
		seen := map[*actors.Delivery]bool{}
		return actor.ReceiveFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case *actors.Delivery:
				if !seen[m] {
					seen[m] = true
					c.Send(c.Self(), m) // the same delivery again, once
					c.Send(c.Self(), &later{m})
				}
			case *later:
				m.d.Respond(c, actors.Ack{})
			}
		})
	})})
	res, err := k.Run(context.Background(), deposits(10, 2)...)
	require.NoError(t, err)
	require.Equal(t, 10, res.Acked())
}

// An actor that panics at every delivery is restarted until its
// supervisor's budget is spent, then replaced, as in a group; every event
// ends dead-lettered after its retry budget, and the pass ends.
func TestAnActorThatAlwaysPanicsDeadLettersEveryEvent(t *testing.T) {
	t.Parallel()
	k := newKit(t, actors.GroupOptions{Buckets: 1, Handler: actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*actors.Delivery); ok {
			panic("always")
		}
	})})
	res, err := k.Run(context.Background(), deposits(6, 2)...)
	require.NoError(t, err)
	require.Len(t, res.DeadLetters(), 6)
	for _, o := range res.DeadLetters() {
		require.Contains(t, o.DeadLetter, "handler panicked: always")
	}
	handlers := map[int]bool{}
	for _, d := range res.Deliveries {
		handlers[d.Handler] = true
	}
	require.Greater(t, len(handlers), 1, "the stopped handler was replaced")
}

// What an actor does after it responds is done when Run returns: the kit
// waits for every handler to stop. The handler here records its effect only
// once the gate opens, and the gate opens at the latest 200 ms after Run is
// called (sooner if Run returns first), so a Run that returned before the
// handler's Receive did would see nothing recorded.
func TestRunReturnsAfterTheHandlersLastReceive(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var recorded atomic.Int32
	k := newKit(t, actors.GroupOptions{Buckets: 1, Handler: actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*actors.Delivery); ok {
			c.Respond(actors.Ack{})
			<-gate
			recorded.Add(1)
		}
	})})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	timer := time.AfterFunc(200*time.Millisecond, open)
	res, err := k.Run(context.Background(), deposits(1, 1)...)
	seen := recorded.Load()
	timer.Stop()
	open()
	require.NoError(t, err)
	require.Equal(t, 1, res.Acked())
	require.Equal(t, int32(1), seen, "Run returned while the handler was still in its Receive")
}
