package overflow

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kumi-run/kumi/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// waitTimeout bounds every wait in these tests; nothing sleeps to let
// things happen.
const waitTimeout = 10 * time.Second

// batch is a publisher batch in these tests.
type batch struct{ n int }

func (batch) OverflowBatch() {}

// other is any message that is not a batch.
type other struct{ n int }

func newSystem(t testing.TB) *actor.ActorSystem {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler) // protoactor logs every recovery at Info
	}))
	t.Cleanup(func() {
		if !sys.IsStopped() { // Shutdown panics when called twice
			sys.Shutdown()
		}
	})
	return sys
}

func newQueue(t testing.TB, cfg Config) *Queue {
	t.Helper()
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// stop stops pid and waits until it has terminated; protoactor's Shutdown
// stops no actor.
func stop(t testing.TB, sys *actor.ActorSystem, pid *actor.PID) {
	t.Helper()
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatalf("stop %v: %v", pid, err)
	}
}

// recv waits for one value from ch.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// countingDispatcher runs each scheduled mailbox run on its own goroutine,
// counting schedules and reporting, on exited, every time a run returns.
type countingDispatcher struct {
	scheduled atomic.Int64
	running   atomic.Int64
	exited    chan struct{}
}

func newCountingDispatcher() *countingDispatcher {
	return &countingDispatcher{exited: make(chan struct{}, 1<<16)}
}

func (d *countingDispatcher) Schedule(fn func()) {
	d.scheduled.Add(1)
	d.running.Add(1)
	go func() {
		fn()
		d.running.Add(-1)
		d.exited <- struct{}{}
	}()
}

func (d *countingDispatcher) Throughput() int { return 300 }

// waitIdle waits until no mailbox run is in progress: a mailbox that kept
// believing it had work would never get there.
func (d *countingDispatcher) waitIdle(t testing.TB) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for d.running.Load() != 0 {
		select {
		case <-d.exited:
		case <-deadline:
			t.Fatalf("mailbox still running after %v: it spins", waitTimeout)
		}
	}
}
