package actors

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// probe collects the batches a publisher posts to it.
type probe struct {
	mu      sync.Mutex
	batches []*liveBatch
	signals []any
}

func (p *probe) Receive(ctx actor.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch m := ctx.Message().(type) {
	case *liveBatch:
		p.batches = append(p.batches, m)
	case *overflow.PausedSignal, *overflow.OverflowedSignal:
		p.signals = append(p.signals, m)
	}
}

func (p *probe) snapshot() ([]*liveBatch, []any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*liveBatch(nil), p.batches...), append([]any(nil), p.signals...)
}

func startPublisher(t *testing.T, store *eventsource.Store) (*actor.ActorSystem, *actor.PID, chan struct{}) {
	t.Helper()
	sys := quietSystem()
	wake := make(chan struct{}, 1)
	pid := sys.Root.Spawn(newPublisherProps(store, publisherOptions{wake: wake, poll: 20 * time.Millisecond, logger: testLoggerOrDiscard(), tel: newTelemetry(nil, testLoggerOrDiscard())}))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })
	return sys, pid, wake
}

func TestPublisher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AdvancesCheaplyWithNoSubscribers", func(t *testing.T) {
		t.Parallel()
		store, _ := newTestStore(t)
		seed(t, store, "acct", 5, 50)
		_, err := store.Sequence(ctx)
		require.NoError(t, err)
		sys, pid, _ := startPublisher(t, store)
		// A subscriber arriving later gets batches that start at the
		// advanced position: the tail was followed without payloads.
		pgtest.Eventually(t, 10*time.Second, func() bool {
			var pos int64
			f := sys.Root.RequestFuture(pid, &publisherPosition{}, time.Second)
			if r, err := f.Result(); err == nil {
				pos = r.(int64)
			}
			return pos == 50
		}, "publisher position reaches the head")
	})

	t.Run("ClosesTheAttachRace", func(t *testing.T) {
		t.Parallel()
		store, _ := newTestStore(t)
		sys, pid, _ := startPublisher(t, store)
		stop := make(chan struct{})
		var appends sync.WaitGroup
		appends.Add(1)
		go func() {
			defer appends.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = store.Append(ctx, fmt.Sprintf("acct-%d", i%7), eventsource.Any, []eventsource.EventData{{Type: "T", Data: []byte(`{}`)}})
				_, _ = store.Sequence(ctx)
			}
		}()
		// Subscribers attach at arbitrary moments while events flow.
		var probes []*probe
		for i := 0; i < 5; i++ {
			p := &probe{}
			probes = append(probes, p)
			ppid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }))
			t.Cleanup(func() { _ = sys.Root.StopFuture(ppid).Wait() })
			sys.Root.Send(pid, &subscribe{PID: ppid, Category: "acct", Size: 1, Bucket: 0})
			time.Sleep(30 * time.Millisecond) // spread the attach moments; not a wait for a condition
		}
		close(stop)
		appends.Wait()
		_, err := store.Sequence(ctx)
		require.NoError(t, err)
		head, err := store.HeadPosition(ctx)
		require.NoError(t, err)
		for i, p := range probes {
			pgtest.Eventually(t, 10*time.Second, func() bool {
				b, _ := p.snapshot()
				return len(b) > 0 && b[len(b)-1].To == head
			}, "probe %d reaches the head", i)
			batches, _ := p.snapshot()
			// Contiguous ranges, and each covers exactly the events in it.
			for j, b := range batches {
				if j > 0 {
					require.Equal(t, batches[j-1].To, b.From, "probe %d batch %d is contiguous", i, j)
				}
				want, err := store.ReadCategory(ctx, "acct", b.From, int(b.To-b.From))
				require.NoError(t, err)
				var in []int64
				for _, e := range want {
					if e.Position <= b.To {
						in = append(in, e.Position)
					}
				}
				var got []int64
				for _, e := range b.Events {
					got = append(got, e.Position)
				}
				require.Equal(t, in, got, "probe %d batch %d holds every event of its range", i, j)
			}
		}
	})

	t.Run("AppliesEachOverflowPolicyWithoutBlocking", func(t *testing.T) {
		t.Parallel()
		for _, policy := range []overflow.Policy{overflow.PauseAndResume, overflow.DropSubscription, overflow.DropOldest} {
			store, _ := newTestStore(t)
			sys, pid, wake := startPublisher(t, store)
			q, err := overflow.New(overflow.Config{Capacity: 2, Policy: policy})
			require.NoError(t, err)
			q.Hold() // a stalled subscriber: nothing is taken from its queue
			p := &probe{}
			ppid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p }, actor.WithMailbox(q.Mailbox())))
			sys.Root.Send(pid, &subscribe{PID: ppid, Category: "acct", Size: 1, Bucket: 0})
			// The publisher answers in mailbox order: once it has, the
			// subscription is registered at its current position.
			_, err = sys.Root.RequestFuture(pid, &publisherPosition{}, 10*time.Second).Result()
			require.NoError(t, err)
			for i := 0; i < 5; i++ {
				seed(t, store, "acct", 3, 3)
				_, err := store.Sequence(ctx)
				require.NoError(t, err)
				wake <- struct{}{}
				pgtest.Eventually(t, 10*time.Second, func() bool { return q.Stats().Posted >= uint64(i+1) }, "batch %d posted: %+v", i, observed(q.Stats))
			}
			st := q.Stats()
			switch policy {
			case overflow.PauseAndResume:
				require.Equal(t, overflow.Paused, st.State)
			case overflow.DropSubscription:
				require.Equal(t, overflow.Overflowed, st.State)
				require.ErrorIs(t, q.Err(), overflow.ErrOverflowed)
			case overflow.DropOldest:
				require.Equal(t, overflow.Active, st.State)
				require.Equal(t, 2, st.Depth)
				require.Equal(t, uint64(3), st.Evicted)
			}
			q.Release()
			_ = sys.Root.StopFuture(ppid).Wait()
		}
	})
}

// slowReads is a store whose reads need at least need of their context's
// time: one bounded tighter runs out of time (as a page with an
// unreadable event does, read twice on a loaded server) and fails with
// its context's error.
type slowReads struct {
	eventsource.PageReader
	need time.Duration
}

func (s slowReads) enough(ctx context.Context) error {
	if d, ok := ctx.Deadline(); ok && time.Until(d) < s.need {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (s slowReads) HeadPosition(ctx context.Context) (int64, error) {
	if err := s.enough(ctx); err != nil {
		return 0, err
	}
	return s.PageReader.HeadPosition(ctx)
}

func (s slowReads) ReadAllPage(ctx context.Context, p eventsource.Page) ([]eventsource.RecordedEvent, error) {
	if err := s.enough(ctx); err != nil {
		return nil, err
	}
	return s.PageReader.ReadAllPage(ctx, p)
}

// TestAPublisherFetchThatRunsOutOfTimeGetsALongerBound: a read slower than
// a fetch's bound is not cut off at the same point for ever (the readers
// waiting for the publisher with it): each fetch that ran out of time
// doubles the next one's bound, until one lands.
func TestAPublisherFetchThatRunsOutOfTimeGetsALongerBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := newTestStore(t)
	sys := quietSystem()
	// Reads need 4 bounds' time: the fourth fetch, bounded by 8, lands.
	// (The start's read of the head has a bound of its own.)
	const bound = 50 * time.Millisecond
	pid := sys.Root.Spawn(newPublisherProps(slowReads{PageReader: store, need: 4 * bound}, publisherOptions{wake: make(chan struct{}, 1),
		poll: 20 * time.Millisecond, logger: testLoggerOrDiscard(), tel: newTelemetry(nil, testLoggerOrDiscard()), fetchTimeout: bound}))
	t.Cleanup(func() { _ = sys.Root.StopFuture(pid).Wait() })
	seed(t, store, "acct", 5, 50)
	_, err := store.Sequence(ctx)
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		var pos int64
		f := sys.Root.RequestFuture(pid, &publisherPosition{}, time.Second)
		if r, err := f.Result(); err == nil {
			pos = r.(int64)
		}
		return pos == 50
	}, "publisher position reaches the head through reads slower than its first bound")
}
