package actors

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// lastWords is a reader's mailbox middleware that watches its end: drained
// runs as the reader's successful drain to the cut is posted to it (before
// the reader sends its coordinator readerCutDrained), and stopped is closed
// once the reader has processed its Stop — it has stopped, and its
// Terminated is posted to its coordinator.
type lastWords struct {
	drained     func()
	drainedOnce sync.Once
	stopped     chan struct{}
	stoppedOnce sync.Once
}

func (m *lastWords) MailboxStarted() {}
func (m *lastWords) MailboxEmpty()   {}

func (m *lastWords) MessagePosted(msg any) {
	if d, ok := actor.UnwrapEnvelopeMessage(msg).(*cutDrained); ok && d.err == nil {
		m.drainedOnce.Do(m.drained)
	}
}

func (m *lastWords) MessageReceived(msg any) {
	if _, ok := msg.(*actor.Stop); ok {
		m.stoppedOnce.Do(func() { close(m.stopped) })
	}
}

// onCoordinator runs f on the coordinator's goroutine, and waits for it.
func (w *testWorker) onCoordinator(t *testing.T, f func(*coordinator)) {
	t.Helper()
	done := make(chan struct{})
	w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(c *coordinator) { f(c); close(done) }))
	select {
	case <-done:
	case <-time.After(waitLong):
		t.Fatalf("the coordinator did not answer in %v", waitLong)
	}
}

// A reader's Terminated is a system message: it overtakes the reader's
// last messages. The coordinator acted on it at once — the slot still
// owned at the reader's epoch, it spawned a reader again — before it read
// the readerCutDrained behind it: a reader for a slot just drained to the
// cut and released for good, which delivered nothing, failed its fence
// and was stopped. Here the coordinator is kept busy while the reader
// drains to the cut and stops, so that it finds both the reader's last
// message and its Terminated waiting, as a loaded machine has it.
func TestNoReaderIsSpawnedForASlotDrainedToTheCut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 4, 20)
	require.NoError(t, leasestore.Migrate(ctx, store.Pool(), schema))

	// Another worker holds the only bucket at first, so that the tests'
	// middleware is in place before the worker spawns its reader.
	other, err := leasestore.New(ctx, pgtest.Pool(t), leasestore.Config{Schema: schema, Subscription: "drained",
		Worker: "other", Buckets: 1, TTL: 30 * time.Second, NoListen: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	res, err := other.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, 1)

	rec := newRecorder()
	opts := groupOpts("drained", 1, rec, "w")
	opts.Lease = resizeLease()
	w := startWorker(t, schema, "w", opts)
	var mu sync.Mutex
	spawned := map[int]int{} // readers spawned, by slot
	words := &lastWords{stopped: make(chan struct{})}
	words.drained = func() {
		// The coordinator waits, behind what it has queued, until the
		// reader has stopped; readerCutDrained comes after this.
		w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(*coordinator) {
			select {
			case <-words.stopped:
			case <-time.After(waitLong):
			}
		}))
	}
	w.onCoordinator(t, func(c *coordinator) {
		c.readerMailbox = func(l leasestore.Lease) []actor.MailboxMiddleware {
			mu.Lock()
			defer mu.Unlock()
			spawned[l.Slot]++
			if l.Slot == 0 {
				return []actor.MailboxMiddleware{words}
			}
			return nil
		}
	})
	require.NoError(t, other.Leave(ctx))
	first := w.readerOf(t, 0)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 20 }, "every event delivered")

	_, err = Resize(ctx, store, "drained", 2, ResizeOptions{By: "test"})
	require.NoError(t, err)
	select {
	case <-words.stopped:
	case <-time.After(waitLong):
		t.Fatalf("the reader of slot 0 never drained to the cut and stopped: %v", w.inspectReaders())
	}
	// The coordinator has both the reader's last message and its
	// Terminated; once it has acted on them, slot 0 has no reader.
	var now *actor.PID
	pgtest.Eventually(t, waitLong, func() bool {
		w.onCoordinator(t, func(c *coordinator) {
			now = nil
			if ref := c.readers[0]; ref != nil {
				now = ref.pid
			}
		})
		return now == nil || !now.Equal(first)
	}, "the coordinator acts on the end of the reader of slot 0")
	mu.Lock()
	n := spawned[0]
	mu.Unlock()
	require.Equal(t, 1, n, "readers spawned for slot 0, drained to the cut (its reader now: %v)", observed(func() string {
		if now == nil {
			return "none"
		}
		return now.Id
	}))
	require.Nil(t, now, "slot 0, drained to the cut, has a reader again")

	pgtest.Eventually(t, waitLong, func() bool {
		r, err := leasestore.ReadResize(ctx, store.Pool(), schema, "drained")
		return err == nil && r.State == leasestore.ResizeSteady && r.Generation == 1
	}, "the resize completes")
}
