package actors

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/supervision"
)

// A reader reads nothing before its checkpoint is loaded. Its first
// handler stopped at once and was replaced before the checkpoint came
// back; the replacement's pump started a catch-up read from the cursor's
// zero value, and the events it read — covered by the checkpoint — were
// delivered again.
func TestReaderReadsNothingBeforeItsCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 10)
	_, err := store.Sequence(ctx) // a checkpoint above the head is refused
	require.NoError(t, err)
	const checkpoint = 5
	_, err = store.SaveCheckpoint(ctx, "early", 0, checkpoint, nil)
	require.NoError(t, err)

	// The reader's checkpoint load waits for this transaction.
	unlock := holdInTransaction(t, "LOCK TABLE "+pgx.Identifier{schema, "checkpoints"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")

	var spawned atomic.Int32
	var mu sync.Mutex
	var delivered []int64
	opts := groupOpts("early", 1, nil, "w")
	opts.Retry.Backoff = supervision.Backoff{Initial: time.Millisecond, Max: time.Millisecond}
	opts.Lease = leasestore.LeaseOptions{TTL: 30 * time.Second, Heartbeat: time.Second, Margin: 10 * time.Second}
	opts.Handler = actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *actor.Started:
			if spawned.Add(1) == 1 {
				ctx.Stop(ctx.Self()) // the first handler stops at once: its reader replaces it
			}
		case *Delivery:
			mu.Lock()
			delivered = append(delivered, m.Event.Position)
			mu.Unlock()
			ctx.Respond(Ack{})
		}
	})
	w := startWorker(t, schema, "w", opts)
	pgtest.Eventually(t, waitLong, func() bool { return spawned.Load() >= 2 }, "the first handler is replaced")
	pid := w.readerOf(t, 0)
	var state string
	var early bool
	w.onReader(t, pid, func(r *reader) {
		state = r.describe()
		early = !r.loaded() && (r.feed.Reading() || len(r.feed.Pending()) > 0 || r.inFlight() > 0 || r.feed.Cursor() != 0)
		require.False(t, r.loaded(), "the precondition: the checkpoint is not loaded yet (%s)", state)
	})
	require.False(t, early, "the reader read before its checkpoint was loaded: %s", state)

	unlock()
	pgtest.Eventually(t, waitLong, func() bool {
		cp, err := store.Checkpoint(ctx, "early", 0)
		require.NoError(t, err)
		return cp == 10
	}, "every event after the checkpoint is delivered")
	mu.Lock()
	defer mu.Unlock()
	for _, p := range delivered {
		require.Greater(t, p, int64(checkpoint), "delivered %v: an event the checkpoint covers was delivered again", delivered)
	}
}
