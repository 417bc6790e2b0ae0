package actors

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// spawnCounter is a log handler that counts the group's reader spawns
// ("kumi: reader starts"), passing every record on to next, if any.
type spawnCounter struct {
	n    *atomic.Int64
	next slog.Handler
}

func (h spawnCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h spawnCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "kumi: reader starts" {
		h.n.Add(1)
	}
	if h.next != nil && h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h spawnCounter) WithAttrs(as []slog.Attr) slog.Handler {
	if h.next != nil {
		h.next = h.next.WithAttrs(as)
	}
	return h
}

func (h spawnCounter) WithGroup(name string) slog.Handler {
	if h.next != nil {
		h.next = h.next.WithGroup(name)
	}
	return h
}

// A reader stopped unsure of its lease tells its coordinator and stops;
// the coordinator must not spawn a reader for the slot again before a pass
// confirms the lease, whichever of the two messages — the reader's own,
// and the Terminated of its stop, a system message that overtakes it — it
// takes first. (Before, taking the Terminated first, it spawned a reader
// at once; then, taking the reader's message, it forgot the slot, and
// its next sync stopped that reader at once — with a function handler,
// mid-run, the event in the handler's hands given up — and the reader
// spawned after the next pass, at the same epoch, delivered that event
// again as a first attempt: the "delivered twice by w1 at epoch 1" of
// TestResizeUpAndDownInProcess/session.)
func TestAReaderStoppedUnsureIsNotRespawnedBeforeAPassConfirmsTheLease(t *testing.T) {
	t.Parallel()
	_, schema := newTestStore(t)
	var spawns atomic.Int64
	u := startUnsureIn(t, schema, "unsurerespawn", func(o *GroupOptions, _ *recorder) {
		var next slog.Handler
		if l := testLogger(); l != nil {
			next = l.Handler()
		}
		o.Logger = slog.New(spawnCounter{n: &spawns, next: next})
	}, nil)
	require.EqualValues(t, 1, spawns.Load(), "one reader for the one bucket")
	reader := u.w.readerOf(t, 0)

	release := u.holdRenewals(t)
	defer release()
	pgtest.Eventually(t, waitLong, func() bool { return u.w.group.g.leases.EnsureHeld(0) != nil }, "the lease becomes unsure")

	// The coordinator is held while the reader stops, so that it finds
	// both the reader's message and its Terminated in its mailbox, and
	// takes the Terminated first.
	hold, held := make(chan struct{}), make(chan struct{})
	unhold := func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	}
	defer unhold()
	u.w.sys.Root.Send(u.w.group.coordinator, inspectCoordinator(func(*coordinator) {
		close(held)
		<-hold
	}))
	<-held
	stopped := make(chan struct{})
	watcher := u.w.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *actor.Started:
			c.Watch(reader)
		case *actor.Terminated:
			if m.Who.Equal(reader) {
				close(stopped)
			}
		}
	}))
	defer u.w.sys.Root.Stop(watcher)
	seed(t, u.store, "acct", 1, 1) // the next delivery finds the lease unsure
	select {
	case <-stopped: // its parent is told right after its watchers
	case <-time.After(waitLong):
		t.Fatalf("the reader did not stop on the unsure lease%s", u.w.diagnose())
	}
	unhold()

	pgtest.Eventually(t, waitLong, func() bool { return len(u.w.owned()) == 0 },
		"the coordinator forgets the bucket (owned %v)", observed(u.w.owned))
	require.EqualValues(t, 1, spawns.Load(), "no reader spawned for the bucket while no pass confirmed its lease")

	release() // the renewal lands: the lease was held all along
	pgtest.Eventually(t, waitLong, func() bool { return u.rec.distinct() == 51 }, "the new event handled by the respawned reader (got %d)%s",
		observed(u.rec.distinct), observed(u.w.diagnose))
	require.Zero(t, u.rec.duplicates())
}
