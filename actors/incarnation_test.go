package actors

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// heldHandler acks every delivery at once except the first delivery of
// the events at the given ranks in delivery order (1-based), which it
// keeps unanswered and hands to the test, which answers them (or not)
// with Delivery.Respond, as a handler that finishes an event later does.
type heldHandler struct {
	mu    sync.Mutex
	seen  map[int64]bool // positions delivered at least once
	order []int64        // distinct positions in delivery order
	acked map[int64]bool // positions a handler acked
	hold  map[int]bool   // ranks to hold
	held  chan *Delivery // the held deliveries
}

func newHeldHandler(ranks ...int) *heldHandler {
	h := &heldHandler{seen: map[int64]bool{}, acked: map[int64]bool{}, hold: map[int]bool{}, held: make(chan *Delivery, len(ranks))}
	for _, n := range ranks {
		h.hold[n] = true
	}
	return h
}

func (h *heldHandler) props() *actor.Props {
	return actor.PropsFromFunc(func(ctx actor.Context) {
		d, ok := ctx.Message().(*Delivery)
		if !ok {
			return
		}
		h.mu.Lock()
		p := d.Event.Position
		first := !h.seen[p]
		if first {
			h.seen[p] = true
			h.order = append(h.order, p)
		}
		if first && h.hold[len(h.order)] {
			h.mu.Unlock()
			h.held <- d
			return
		}
		h.acked[p] = true
		h.mu.Unlock()
		ctx.Respond(Ack{})
	})
}

// next returns the next held delivery.
func (h *heldHandler) next(t *testing.T) *Delivery {
	t.Helper()
	select {
	case d := <-h.held:
		return d
	case <-time.After(waitLong):
		h.mu.Lock()
		defer h.mu.Unlock()
		t.Fatalf("no delivery held within %v; delivered %v", waitLong, h.order)
		return nil
	}
}

// ack answers a held delivery with Ack, as its handler does once done.
func (h *heldHandler) ack(sys *actor.ActorSystem, d *Delivery) {
	h.mu.Lock()
	h.acked[d.Event.Position] = true
	h.mu.Unlock()
	d.Respond(sys.Root, Ack{})
}

func (h *heldHandler) ackedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.acked)
}

// readerOf returns the reader actor of a slot, as the coordinator knows it.
func (w *testWorker) readerOf(t *testing.T, slot int) *actor.PID {
	t.Helper()
	var pid *actor.PID
	pgtest.Eventually(t, waitLong, func() bool {
		got := make(chan *actor.PID, 1)
		w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(c *coordinator) {
			if ref := c.readers[slot]; ref != nil {
				got <- ref.pid
				return
			}
			got <- nil
		}))
		pid = <-got
		return pid != nil
	}, "slot %d has a reader", slot)
	return pid
}

// onReader runs f on the goroutine of the reader at pid, and waits for it.
func (w *testWorker) onReader(t *testing.T, pid *actor.PID, f func(*reader)) {
	t.Helper()
	done := make(chan struct{})
	w.sys.Root.Send(pid, inspectReader(func(r *reader) { f(r); close(done) }))
	select {
	case <-done:
	case <-time.After(waitLong):
		t.Fatalf("the reader %s did not answer in %v", pid, waitLong)
	}
}

// A supervisor restarts a reader with the same PID and mailbox. An answer
// to a delivery of its earlier incarnation — a handler that acks late —
// still arrives there, and must not be taken for an answer to the new
// incarnation: delivery ids were numbered per incarnation, so the late
// Ack of the old incarnation's 5th delivery finished the new one's 5th,
// an event its handler had not acked (and cancelled that delivery's
// context): the checkpoint then moved past an event nobody handled.
func TestRestartedReaderIgnoresItsPredecessorsAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 12) // one stream: delivered in position order
	h := newHeldHandler(5, 9)
	opts := groupOpts("incarnation", 1, nil, "w")
	opts.Handler = h.props()
	opts.HandlerTimeout = 10 * waitLong // nothing here times out
	opts.CheckpointEvery = 1
	opts.Lease = leasestore.LeaseOptions{TTL: 30 * time.Second, Heartbeat: time.Second, Margin: 10 * time.Second}
	w := startWorker(t, schema, "w", opts)

	// The first incarnation: four events acked and checkpointed, the
	// fifth with its handler.
	fifth := h.next(t)
	var cp int64
	pgtest.Eventually(t, waitLong, func() bool {
		var err error
		cp, err = store.Checkpoint(ctx, "incarnation", 0)
		require.NoError(t, err)
		return cp == fifth.Event.Position-1
	}, "the checkpoint reaches the fourth event (%d); it is at %d", fifth.Event.Position-1, observed(func() int64 { return cp }))

	pid := w.readerOf(t, 0)
	var first *reader
	w.onReader(t, pid, func(r *reader) { first = r })
	w.sys.Root.Send(pid, inspectReader(func(*reader) { panic(errors.New("test: the reader fails")) }))

	// The second incarnation starts from the fourth event: its fifth
	// delivery is the ninth event, held by its handler.
	ninth := h.next(t)
	w.onReader(t, pid, func(r *reader) {
		require.NotSame(t, first, r, "the reader was restarted in place")
	})

	// The first incarnation's handler acks its fifth delivery late.
	h.ack(w.sys, fifth)
	var acked int64
	var sent bool
	w.onReader(t, pid, func(r *reader) {
		acked = r.acked()
		for _, ws := range r.ws.out {
			sent = sent || ws.d.Event.Position == ninth.Event.Position
		}
	})
	require.True(t, sent && acked < ninth.Event.Position && ninth.Context.Err() == nil,
		"the late ack of the first incarnation's delivery of position %d was taken for the second's delivery of "+
			"position %d, which no handler acked: slot still sent %v, acked %d, its context's error %v",
		fifth.Event.Position, ninth.Event.Position, sent, acked, ninth.Context.Err())

	// The ninth event acked, every event is handled and checkpointed.
	h.ack(w.sys, ninth)
	last := fifth.Event.Position + 7
	pgtest.Eventually(t, waitLong, func() bool {
		var err error
		cp, err = store.Checkpoint(ctx, "incarnation", 0)
		require.NoError(t, err)
		return cp == last
	}, "the checkpoint reaches the last event (%d); it is at %d", last, observed(func() int64 { return cp }))
	require.Equal(t, 12, h.ackedCount(), "events acked by a handler")
}

// A reader asked to drain (a handoff, a graceful stop) and restarted by
// its supervisor before the drain ends drains too: the drain was asked of
// the bucket's reader, and the coordinator asks once. The restarted
// reader forgot it, went on delivering, and never stopped: the stop (or
// the handoff) waited for it for ever.
func TestRestartedReaderFinishesItsDrain(t *testing.T) {
	t.Parallel()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 6)
	h := newHeldHandler(3)
	opts := groupOpts("redrain", 1, nil, "w")
	opts.Handler = h.props()
	opts.HandlerTimeout = 10 * waitLong
	opts.Lease = leasestore.LeaseOptions{TTL: 30 * time.Second, Heartbeat: time.Second, Margin: 10 * time.Second}
	w := startWorker(t, schema, "w", opts)
	h.next(t) // the third event is with the handler: the drain waits for it

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong/2)
		defer cancel()
		stopped <- w.group.Stop(ctx)
	}()
	pid := w.readerOf(t, 0)
	draining := false
	pgtest.Eventually(t, waitLong, func() bool {
		w.onReader(t, pid, func(r *reader) { draining = r.draining })
		return draining
	}, "the reader is asked to drain")
	delivered := func() int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.order)
	}
	before := delivered()
	w.sys.Root.Send(pid, inspectReader(func(*reader) { panic(errors.New("test: the reader fails")) }))

	select {
	case err := <-stopped:
		require.NoError(t, err, "the graceful stop")
	case <-time.After(waitLong):
		t.Fatalf("the graceful stop did not end: the restarted reader did not drain (%d events delivered before the restart, %d now)",
			before, delivered())
	}
	require.Equal(t, before, delivered(), "events delivered after the drain was asked")
}
