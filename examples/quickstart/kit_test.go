package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/kumitest"
)

// output is the handler's output, safe to share with its actor.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) lines() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Split(strings.TrimSpace(o.buf.String()), "\n")
}

func newKit(t *testing.T, out *output) *kumitest.Kit {
	t.Helper()
	k, err := kumitest.New(kumitest.Options{Group: actors.GroupOptions{
		Subscription: "balances", Category: "account", Buckets: 16, Handler: handler(out).Props(),
	}})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	return k
}

// Given deposits and an event of another type, the handler prints each
// deposit, acks the other event, and dead-letters data that does not
// decode.
func TestTheHandlerWithTheKit(t *testing.T) {
	t.Parallel()
	var out output
	res, err := newKit(t, &out).Run(context.Background(),
		kumitest.Event{Stream: "account-42", Type: "Deposited", Data: Deposited{Amount: 10}},
		kumitest.Event{Stream: "account-7", Type: "Opened", Data: map[string]string{"owner": "ann"}},
		kumitest.Event{Stream: "account-42", Type: "Deposited", Data: []byte(`{"amount":"ten"}`)},
		kumitest.Event{Stream: "account-42", Type: "Deposited", Data: Deposited{Amount: 5}},
	)
	require.NoError(t, err)
	require.Equal(t, 3, res.Acked())
	require.True(t, res.Outcomes[1].Acked, "another type: acked")
	dead := res.DeadLetters()
	require.Len(t, dead, 1)
	require.EqualValues(t, 1, dead[0].Event.Version)
	require.Contains(t, dead[0].DeadLetter, "decode Deposited event into main.Deposited", "dead-lettered at once, never retried")
	require.Equal(t, 1, dead[0].Attempts)
	require.Equal(t, []string{"account-42 deposited 10", "account-42 deposited 5"}, out.lines())
}

// The handler prints: it is at-least-once, not idempotent. A handoff or a
// resize repeats nothing, so it prints each deposit once; a crash repeats
// the tail, and the kit says so.
func TestTheHandlerUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var events []kumitest.Event
	for i := range 40 {
		events = append(events, kumitest.Event{Stream: []string{"account-1", "account-2", "account-3"}[i%3], Type: "Deposited", Data: Deposited{Amount: i}})
	}
	var k *kumitest.Kit
	world := func() kumitest.World {
		out := &output{}
		return kumitest.World{Handler: handler(out).Props(), Effects: func() any { return out.lines() }}
	}
	k = newKit(t, &output{})
	require.NoError(t, k.Check(ctx, events, world, kumitest.CheckOptions{Faults: []kumitest.Fault{kumitest.Handoff, kumitest.ResizeCut}}))
	err := k.Check(ctx, events, world, kumitest.CheckOptions{Faults: []kumitest.Fault{kumitest.CrashTail}})
	var fe *kumitest.FaultError
	require.ErrorAs(t, err, &fe, "a crash prints the tail again")
	require.Greater(t, len(fe.Faulty.([]string)), len(fe.Clean.([]string)))
}
