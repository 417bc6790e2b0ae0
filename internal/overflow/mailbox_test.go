package overflow

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// stallable is an actor that forwards what it receives to out, and blocks on
// its first batch until gate is closed — a consumer that stopped consuming.
type stallable struct {
	out     chan any
	gate    chan struct{}
	stalled chan struct{}
	first   bool
}

func newStallable(buf int) *stallable {
	return &stallable{out: make(chan any, buf), gate: make(chan struct{}), stalled: make(chan struct{}), first: true}
}

func (s *stallable) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case batch:
		if s.first {
			s.first = false
			close(s.stalled)
			<-s.gate
		}
		s.out <- msg
	case other, *PausedSignal, *OverflowedSignal, *actor.Started:
		s.out <- msg
	case int: // a panic on demand
		panic(fmt.Sprintf("boom %d", msg))
	}
}

func spawnStallable(t *testing.T, sys *actor.ActorSystem, q *Queue, s *stallable, opts ...actor.PropsOption) *actor.PID {
	t.Helper()
	opts = append(opts, actor.WithMailbox(q.Mailbox()))
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return s }, opts...))
	if _, ok := recv(t, s.out, "Started").(*actor.Started); !ok {
		t.Fatal("first message is not Started")
	}
	return pid
}

func TestMailbox(t *testing.T) {
	t.Parallel()

	t.Run("PosterNeverBlocksOnAStalledActor", func(t *testing.T) {
		t.Parallel()
		const posts, capacity = 100_000, 64
		for _, p := range []Policy{PauseAndResume, DropSubscription, DropOldest} {
			t.Run(p.String(), func(t *testing.T) {
				t.Parallel()
				sys := newSystem(t)
				q := newQueue(t, Config{Capacity: capacity, Policy: p})
				s := newStallable(capacity + 8)
				pid := spawnStallable(t, sys, q, s)
				defer stop(t, sys, pid)

				sys.Root.Send(pid, batch{0})
				recv(t, s.stalled, "the actor to stall")
				done := make(chan time.Duration)
				go func() {
					start := time.Now()
					for i := 1; i < posts; i++ {
						sys.Root.Send(pid, batch{i})
					}
					done <- time.Since(start)
				}()
				t.Logf("posted %d batches to a stalled actor in %v", posts, recv(t, done, "the poster"))

				st := q.Stats()
				checkInvariant(t, st)
				if st.Posted != posts || st.Delivered != 1 {
					t.Fatalf("stats %+v", st)
				}
				close(s.gate)
				if got := recv(t, s.out, "batch 0"); got != (batch{0}) {
					t.Fatalf("got %v, want batch 0", got)
				}
				switch p {
				case PauseAndResume:
					if _, ok := recv(t, s.out, "the pause").(*PausedSignal); !ok || st.Pauses != 1 || st.Depth != 0 {
						t.Fatalf("no pause; stats %+v", st)
					}
				case DropSubscription:
					sig, ok := recv(t, s.out, "the overflow").(*OverflowedSignal)
					if !ok || sig.Err.Posted != capacity+2 || st.State != Overflowed {
						t.Fatalf("no overflow; stats %+v", st)
					}
				case DropOldest:
					for i := posts - capacity; i < posts; i++ {
						if got := recv(t, s.out, "the newest batches"); got != (batch{i}) {
							t.Fatalf("got %v, want batch %d", got, i)
						}
					}
					if st.Evicted != posts-1-capacity || st.Depth != capacity {
						t.Fatalf("stats %+v", st)
					}
				}
			})
		}
	})

	t.Run("NonBatchMessagesBypassTheBound", func(t *testing.T) {
		t.Parallel()
		sys := newSystem(t)
		q := newQueue(t, Config{Capacity: 2})
		s := newStallable(1100)
		pid := spawnStallable(t, sys, q, s)
		defer stop(t, sys, pid)

		sys.Root.Send(pid, batch{0})
		recv(t, s.stalled, "the actor to stall")
		for i := range 1000 {
			sys.Root.Send(pid, other{i})
		}
		for i := 1; i <= 3; i++ { // two fill the queue, the third pauses it
			sys.Root.Send(pid, batch{i})
		}
		close(s.gate)
		recv(t, s.out, "batch 0")
		for i := range 1000 {
			if got := recv(t, s.out, "the other messages"); got != (other{i}) {
				t.Fatalf("got %v, want other %d", got, i)
			}
		}
		if _, ok := recv(t, s.out, "the pause").(*PausedSignal); !ok {
			t.Fatal("no pause signal")
		}
	})

	t.Run("StopOvertakesAFullQueue", func(t *testing.T) {
		t.Parallel()
		sys := newSystem(t)
		q := newQueue(t, Config{Capacity: 2})
		s := newStallable(16)
		pid := spawnStallable(t, sys, q, s)

		sys.Root.Send(pid, batch{0})
		recv(t, s.stalled, "the actor to stall")
		for i := range 1000 {
			sys.Root.Send(pid, other{i})
			sys.Root.Send(pid, batch{i + 1})
		}
		stopped := sys.Root.StopFuture(pid)
		close(s.gate)
		if err := stopped.Wait(); err != nil {
			t.Fatal(err)
		}
		recv(t, s.out, "batch 0")
		select {
		case msg := <-s.out:
			t.Fatalf("a stopped actor received %v", msg)
		default:
		}
	})

	t.Run("StopsWithHeldBatchesQueued", func(t *testing.T) {
		t.Parallel()
		sys := newSystem(t)
		q := newQueue(t, Config{Capacity: 8})
		q.Hold()
		s := newStallable(16)
		pid := spawnStallable(t, sys, q, s)
		for i := range 8 {
			sys.Root.Send(pid, batch{i})
		}
		if q.Depth() != 8 {
			t.Fatalf("depth %d", q.Depth())
		}
		stop(t, sys, pid)
	})

	t.Run("SchedulesNoWorkWhileNothingIsDeliverable", func(t *testing.T) {
		t.Parallel()
		sys := newSystem(t)
		d := newCountingDispatcher()
		q := newQueue(t, Config{Capacity: 4})
		s := newStallable(64)
		s.first = false // never stalls
		pid := spawnStallable(t, sys, q, s, actor.WithDispatcher(d))
		defer stop(t, sys, pid)
		d.waitIdle(t)

		q.Hold()
		before := d.scheduled.Load()
		for i := range 4 {
			sys.Root.Send(pid, batch{i}) // held: nothing to deliver
		}
		if n := d.scheduled.Load(); n != before {
			t.Fatalf("held batches scheduled %d runs", n-before)
		}
		sys.Root.Send(pid, batch{4}) // pauses: the signal is deliverable
		if _, ok := recv(t, s.out, "the pause").(*PausedSignal); !ok {
			t.Fatal("no pause signal")
		}
		d.waitIdle(t)
		before = d.scheduled.Load()
		for i := range 1000 {
			sys.Root.Send(pid, batch{5 + i}) // refused while paused
		}
		if n := d.scheduled.Load(); n != before {
			t.Fatalf("refused batches scheduled %d runs", n-before)
		}
		if err := q.Resume(); err != nil {
			t.Fatal(err)
		}
		sys.Root.Send(pid, batch{-1})
		q.Release()
		if got := recv(t, s.out, "a batch after resume"); got != (batch{-1}) {
			t.Fatalf("got %v", got)
		}
	})

	t.Run("GoesIdleAfterDrops", func(t *testing.T) {
		// protoactor's BoundedDropping never goes idle after its first drop.
		t.Parallel()
		for _, p := range []Policy{PauseAndResume, DropOldest} {
			sys := newSystem(t)
			d := newCountingDispatcher()
			q := newQueue(t, Config{Capacity: 4, Policy: p})
			s := newStallable(16)
			pid := spawnStallable(t, sys, q, s, actor.WithDispatcher(d))

			sys.Root.Send(pid, batch{0})
			recv(t, s.stalled, "the actor to stall")
			for i := 1; i <= 100; i++ {
				sys.Root.Send(pid, batch{i})
			}
			close(s.gate)
			recv(t, s.out, "batch 0")
			want := 4 // the newest batches
			if p == PauseAndResume {
				want = 1 // the pause signal
			}
			for range want {
				recv(t, s.out, "the rest")
			}
			d.waitIdle(t)
			if q.Len() != 0 {
				t.Fatalf("%v: %d messages left", p, q.Len())
			}
			stop(t, sys, pid)
		}
	})

	t.Run("SurvivesARestart", func(t *testing.T) {
		t.Parallel()
		sys := newSystem(t)
		q := newQueue(t, Config{Capacity: 4})
		s := newStallable(16)
		s.first = false
		var mw countingMiddleware
		pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return s }, actor.WithMailbox(q.Mailbox(&mw))))
		defer stop(t, sys, pid)
		recv(t, s.out, "Started")

		sys.Root.Send(pid, 7) // panics; protoactor's root strategy restarts it
		sys.Root.Send(pid, batch{1})
		if _, ok := recv(t, s.out, "Started again").(*actor.Started); !ok {
			t.Fatal("not restarted")
		}
		if got := recv(t, s.out, "the batch"); got != (batch{1}) {
			t.Fatalf("got %v", got)
		}
		if mw.started.Load() != 1 || mw.posted.Load() < 2 || mw.received.Load() < 2 {
			t.Fatalf("middleware calls: started %d posted %d received %d", mw.started.Load(), mw.posted.Load(), mw.received.Load())
		}
	})

	t.Run("RefusesASecondActor", func(t *testing.T) {
		t.Parallel()
		sys := newSystem(t)
		q := newQueue(t, Config{})
		props := actor.PropsFromFunc(func(actor.Context) {}, actor.WithMailbox(q.Mailbox()))
		pid := sys.Root.Spawn(props)
		defer stop(t, sys, pid)
		defer func() {
			if recover() == nil {
				t.Fatal("a second spawn did not panic")
			}
		}()
		sys.Root.Spawn(props)
	})
}

type countingMiddleware struct {
	started, posted, received, empty atomic.Int64
}

func (m *countingMiddleware) MailboxStarted()     { m.started.Add(1) }
func (m *countingMiddleware) MessagePosted(any)   { m.posted.Add(1) }
func (m *countingMiddleware) MessageReceived(any) { m.received.Add(1) }
func (m *countingMiddleware) MailboxEmpty()       { m.empty.Add(1) }
