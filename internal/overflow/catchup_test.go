package overflow

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

// This file models the BucketReader's side of PauseAndResume against a
// model of the store, and checks that it loses nothing: every event
// appended is delivered exactly once, in order, however often the queue
// pauses.

// store models the event store: events are the positions 1..n. An event is
// appended (visible to reads) before the publisher posts it.
type store struct {
	mu sync.Mutex
	n  int
}

func (s *store) append(k int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int, k)
	for i := range out {
		s.n++
		out[i] = s.n
	}
	return out
}

func (s *store) read(after, limit int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for p := after + 1; p <= s.n && len(out) < limit; p++ {
		out = append(out, p)
	}
	return out
}

// liveBatch is what the publisher posts.
type liveBatch struct{ positions []int }

func (liveBatch) OverflowBatch() {}

// page is a catch-up read's result, sent back to the reader.
type page struct {
	gen       int
	positions []int
	last      bool
}

type stall struct{}

const pageSize = 50

// reader follows the protocol in the package documentation.
type reader struct {
	q       *Queue
	st      *store
	out     chan int
	gate    chan struct{}
	stalled chan struct{}
	reads   *sync.WaitGroup // catch-up reads in flight, for goleak
	errs    chan error

	pos int // the last position delivered
	gen int // the current catch-up; pages of older ones only deliver
}

func (r *reader) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		r.catchUp(ctx) // spawned held: catch up from the checkpoint first
	case *PausedSignal:
		r.catchUp(ctx)
	case page:
		r.deliver(msg.positions)
		if msg.gen != r.gen {
			return
		}
		if msg.last {
			r.q.Release() // caught up: the held live batches follow
			return
		}
		r.read(ctx, r.gen)
	case liveBatch:
		r.deliver(msg.positions)
	case stall:
		close(r.stalled)
		<-r.gate
	}
}

func (r *reader) catchUp(ctx actor.Context) {
	r.gen++
	r.q.Hold()       // live batches wait for the catch-up
	_ = r.q.Resume() // before the first read: what it misses is queued
	r.read(ctx, r.gen)
}

func (r *reader) read(ctx actor.Context, gen int) {
	self, sys, from := ctx.Self(), ctx.ActorSystem(), r.pos
	r.reads.Add(1)
	go func() { // a read never blocks the reader's mailbox
		defer r.reads.Done()
		ps := r.st.read(from, pageSize)
		sys.Root.Send(self, page{gen: gen, positions: ps, last: len(ps) < pageSize})
	}()
}

func (r *reader) deliver(positions []int) {
	for _, p := range positions {
		if p <= r.pos {
			continue // already delivered by a catch-up read
		}
		if p != r.pos+1 {
			r.errs <- fmt.Errorf("gap: delivered %d after %d", p, r.pos)
		}
		r.pos = p
		r.out <- p
		runtime.Gosched() // a slowish handler
	}
}

func TestPauseAndResumeLosesNothing(t *testing.T) {
	t.Parallel()
	const batches, perBatch = 2000, 10
	const events = batches * perBatch

	sys := newSystem(t)
	q := newQueue(t, Config{Capacity: 4})
	q.Hold() // held from the start: the reader catches up before going live
	var reads sync.WaitGroup
	r := &reader{
		q: q, st: &store{}, out: make(chan int, events), gate: make(chan struct{}),
		stalled: make(chan struct{}), reads: &reads, errs: make(chan error, 1),
	}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return r }, actor.WithMailbox(q.Mailbox())))

	publish := func(n int) {
		for range n {
			sys.Root.Send(pid, liveBatch{positions: r.st.append(perBatch)})
		}
	}
	next := 1 // the next position the reader must deliver
	consumeUntil := func(last int) {
		for ; next <= last; next++ {
			select {
			case err := <-r.errs:
				t.Fatal(err)
			default:
			}
			if got := recv(t, r.out, fmt.Sprintf("event %d", next)); got != next {
				t.Fatalf("delivered %d, want %d", got, next)
			}
		}
	}

	// A stalled reader pauses its queue for sure.
	sys.Root.Send(pid, stall{})
	recv(t, r.stalled, "the reader to stall")
	publish(100)
	if q.State() != Paused {
		t.Fatalf("state %v, want paused", q.State())
	}
	close(r.gate)
	// Then rounds of 1 to 9 batches, against a queue of 4: the reader keeps
	// up with some and falls behind (and pauses) on others. Every third
	// round waits for the reader to catch up, so that it also goes live.
	for round, published := 0, 100; published < batches; round++ {
		n := min(1+round%9, batches-published)
		publish(n)
		published += n
		if round%3 == 0 {
			consumeUntil(published * perBatch)
		}
	}
	consumeUntil(events)
	stop(t, sys, pid)
	reads.Wait()
	s := q.Stats()
	checkInvariant(t, s)
	t.Logf("%d events, %d batches posted: %d delivered live, %d dropped, %d pauses", events, s.Posted, s.Delivered, s.Dropped, s.Pauses)
	if s.Pauses < 1 || s.Resumes != s.Pauses {
		t.Fatalf("stats %+v", s)
	}
}
