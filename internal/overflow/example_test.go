package overflow_test

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kumi-run/kumi/internal/overflow"
)

// liveBatch is a publisher batch: the marker method puts it under the bound.
type liveBatch struct{ first, last int64 }

func (liveBatch) OverflowBatch() {}

// A Queue used directly: under DropOldest a full queue keeps the newest
// batches, while other messages are never bounded.
func ExampleQueue() {
	q, err := overflow.New(overflow.Config{Capacity: 2, Policy: overflow.DropOldest})
	if err != nil {
		panic(err)
	}
	q.Push(liveBatch{1, 10})
	q.Push("ack 10")
	q.Push(liveBatch{11, 20})
	q.Push(liveBatch{21, 30}) // evicts {1 10}
	for msg, ok := q.Pop(); ok; msg, ok = q.Pop() {
		fmt.Println(msg)
	}
	s := q.Stats()
	fmt.Printf("posted %d, delivered %d, evicted %d\n", s.Posted, s.Delivered, s.Evicted)
	// Output:
	// ack 10
	// {11 20}
	// {21 30}
	// posted 3, delivered 2, evicted 1
}

// An overflowed DropSubscription queue ends the subscription with a typed
// error.
func ExampleOverflowError() {
	q, _ := overflow.New(overflow.Config{Capacity: 1, Policy: overflow.DropSubscription})
	q.Push(liveBatch{1, 10})
	q.Push(liveBatch{11, 20})
	var oe *overflow.OverflowError
	err := q.Err()
	fmt.Println(q.State(), errors.Is(err, overflow.ErrOverflowed), errors.As(err, &oe) && oe.Capacity == 1)
	// Output: overflowed true true
}

// A reader actor on the overflow mailbox: it learns of a pause from a
// PausedSignal in its mailbox, catches up, resumes and releases.
func ExampleQueue_Mailbox() {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	defer sys.Shutdown()

	q, _ := overflow.New(overflow.Config{Capacity: 2}) // PauseAndResume
	q.Hold()                                           // the reader catches up before it goes live
	resumed, done := make(chan struct{}), make(chan struct{})
	reader := func(ctx actor.Context) {
		switch msg := ctx.Message().(type) {
		case *overflow.PausedSignal:
			fmt.Println("paused: the held batches are gone")
			_ = q.Resume() // first resume, then read the store to its tail
			fmt.Println("caught up from the store")
			q.Release() // then deliver what was queued since Resume
			close(resumed)
		case liveBatch:
			fmt.Println("live", msg.first, msg.last)
			close(done)
		}
	}
	pid := sys.Root.Spawn(actor.PropsFromFunc(reader, actor.WithMailbox(q.Mailbox())))
	defer func() { _ = sys.Root.StopFuture(pid).Wait() }()

	for i := range int64(3) { // the third batch finds the held queue full
		sys.Root.Send(pid, liveBatch{10*i + 1, 10*i + 10})
	}
	<-resumed
	sys.Root.Send(pid, liveBatch{31, 40})
	<-done
	// Output:
	// paused: the held batches are gone
	// caught up from the store
	// live 31 40
}
