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
	drained     func(*lastWords)
	drainedOnce sync.Once
	stopped     chan struct{}
	stoppedOnce sync.Once
}

func (m *lastWords) MailboxStarted() {}
func (m *lastWords) MailboxEmpty()   {}

func (m *lastWords) MessagePosted(msg any) {
	if d, ok := actor.UnwrapEnvelopeMessage(msg).(*cutDrained); ok && d.err == nil {
		m.drainedOnce.Do(func() { m.drained(m) })
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
	other, err := leasestore.New(pgtest.Pool(t), leasestore.Config{Schema: schema, Subscription: "drained",
		Worker: "other", Buckets: 1, LeaseOptions: leasestore.LeaseOptions{TTL: 30 * time.Second, NoListen: true}})
	if err == nil {
		err = other.Start(ctx)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Stop(context.Background()) })
	res, err := other.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, 1)

	rec := newRecorder()
	opts := groupOpts("drained", 1, rec, "w")
	opts.Lease = resizeLease()
	w := startWorker(t, schema, "w", opts)
	var mu sync.Mutex
	spawned := 0                         // readers spawned for slot 0
	atDrain := -1                        // of which when one drained to the cut
	draining := make(chan *lastWords, 1) // the reader that drained
	drained := func(words *lastWords) {
		mu.Lock()
		atDrain = spawned
		mu.Unlock()
		// The coordinator waits, behind what it has queued, until the
		// reader has stopped; readerCutDrained comes after this.
		w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(*coordinator) {
			select {
			case <-words.stopped:
			case <-time.After(waitLong):
			}
		}))
		draining <- words
	}
	w.onCoordinator(t, func(c *coordinator) {
		c.readerMailbox = func(l leasestore.Lease) []actor.MailboxMiddleware {
			if l.Slot != 0 {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			spawned++
			return []actor.MailboxMiddleware{&lastWords{drained: drained, stopped: make(chan struct{})}}
		}
	})
	require.NoError(t, other.Leave(ctx))
	w.readerOf(t, 0)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 20 }, "every event delivered")

	_, err = Resize(ctx, store, "drained", 2, ResizeOptions{By: "test"})
	require.NoError(t, err)
	var words *lastWords
	select {
	case words = <-draining:
	case <-time.After(waitLong):
		t.Fatalf("the reader of slot 0 never drained to the cut: %v", w.inspectReaders())
	}
	select {
	case <-words.stopped:
	case <-time.After(waitLong):
		t.Fatalf("the reader of slot 0 never stopped after its drain to the cut: %v", w.inspectReaders())
	}
	// The coordinator has both the reader's last message and its
	// Terminated; once it has acted on them, slot 0 has no reader.
	count := func() (n, at int) {
		mu.Lock()
		defer mu.Unlock()
		return spawned, atDrain
	}
	var reader *actor.PID
	pgtest.Eventually(t, waitLong, func() bool {
		w.onCoordinator(t, func(c *coordinator) {
			reader = nil
			if ref := c.readers[0]; ref != nil {
				reader = ref.pid
			}
		})
		n, at := count()
		return reader == nil || n > at
	}, "the coordinator acts on the end of the reader of slot 0 (its reader now: %v)", observed(func() *actor.PID { return reader }))
	n, at := count()
	require.Equal(t, at, n, "readers spawned for slot 0 after its reader drained it to the cut (%d before)", at)
	require.Nil(t, reader, "slot 0, drained to the cut, has a reader again")

	pgtest.Eventually(t, waitLong, func() bool {
		r, err := leasestore.ReadResize(ctx, store.Pool(), schema, "drained")
		return err == nil && r.State == leasestore.ResizeSteady && r.Generation == 1
	}, "the resize completes")
}
