package actors

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// TestAnIdleReaderArmsNoTick: a reader arms its checkpoint tick only
// while the tick has work. Once everything it handled is checkpointed and
// nothing is pending, it has no tick armed (each idle bucket's tick was 5
// messages a second: 8,000 a second for 100 subscriptions of 16 buckets);
// an event that comes arms it again, and the tick writes its checkpoint
// (CheckpointEvery is never reached here: only the tick writes).
func TestAnIdleReaderArmsNoTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 3)
	var handled, count atomic.Int64
	opts := groupOpts("idletick", 1, nil, "w")
	opts.Handler = Func(func(_ context.Context, d *Delivery) error {
		handled.Store(max(handled.Load(), d.Event.Position))
		count.Add(1)
		return nil
	})
	opts.CheckpointEvery = 1000
	w := startWorker(t, schema, "w", opts)
	pid := w.readerOf(t, 0)

	checkpointAt := func(n int64) {
		t.Helper()
		pgtest.Eventually(t, waitLong, func() bool { return count.Load() >= n }, "%d events handled", n)
		pos := handled.Load()
		var cp int64
		pgtest.Eventually(t, waitLong, func() bool {
			var err error
			cp, err = store.Checkpoint(ctx, "idletick", 0)
			require.NoError(t, err)
			return cp >= pos
		}, "the tick checkpoints position %d; the checkpoint is at %d", pos, observed(func() int64 { return cp }))
	}
	idle := func() {
		t.Helper()
		var ticking bool
		pgtest.Eventually(t, waitLong, func() bool {
			w.onReader(t, pid, func(r *reader) { ticking = r.ticking })
			return !ticking
		}, "the idle reader has no tick armed")
	}
	checkpointAt(3)
	idle()

	seed(t, store, "acct", 1, 1)
	checkpointAt(4)
	idle()
}
