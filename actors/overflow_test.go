package actors

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// Under live load a slow reader's queue overflows; whatever the policy
// drops, the reader sees the gap and re-reads it: nothing is lost for the
// group, nothing is delivered twice, per-stream order holds.
func TestLiveOverflowLosesNothingUnderEveryPolicy(t *testing.T) {
	t.Parallel()
	for _, policy := range []overflow.Policy{overflow.PauseAndResume, overflow.DropSubscription, overflow.DropOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			store, schema := newTestStore(t)
			rec := newRecorder()
			slow := actor.PropsFromFunc(func(ctx actor.Context) {
				if d, ok := ctx.Message().(*Delivery); ok {
					rec.begin("w", d.Event)
					time.Sleep(5 * time.Millisecond) // a slow handler, the point of the test
					rec.end("w", d.Event)
					ctx.Respond(Ack{})
				}
			})
			o := groupOpts("overflow", 2, nil, "w")
			o.Handler, o.QueueCapacity, o.Overflow, o.BatchSize = slow, 1, policy, 2
			w := startWorker(t, schema, "w", o)
			pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 2 }, "owns both buckets")
			const n = 400
			// A steady trickle, faster than the handler: many small batches.
			tick := time.NewTicker(time.Millisecond)
			for i := 0; i < n; i++ {
				<-tick.C
				_, err := store.Append(context.Background(), fmt.Sprintf("acct-%d", i%9), eventsource.Any,
					[]eventsource.EventData{{Type: "Live", Data: []byte(`{}`)}})
				require.NoError(t, err)
			}
			tick.Stop()
			pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == n }, "all %d handled (got %d)", n, rec.distinct())
			require.Zero(t, rec.duplicates())
			require.Empty(t, rec.order)
			dropped := w.group.g.dropped.Load()
			w.group.g.mu.Lock()
			for _, q := range w.group.g.queues {
				dropped += int64(q.Stats().Evicted)
			}
			w.group.g.mu.Unlock()
			require.Positive(t, dropped, "the queue overflowed: the test exercised the policy")
			t.Logf("%s: %d batches dropped and re-read", policy, dropped)
		})
	}
}
