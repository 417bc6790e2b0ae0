package overflow

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// BenchmarkPost measures posting batches to a reader actor through its
// overflow mailbox, with a consumer that keeps up as well as it can
// ("draining") and with one that is stuck ("stalled"), beside protoactor's
// unbounded mailbox as a baseline.
func BenchmarkPost(b *testing.B) {
	for _, p := range []Policy{PauseAndResume, DropSubscription, DropOldest} {
		for _, stalled := range []bool{false, true} {
			name := p.String() + "/draining"
			if stalled {
				name = p.String() + "/stalled"
			}
			b.Run(name, func(b *testing.B) {
				q := newQueue(b, Config{Capacity: CapacityDefault, Policy: p})
				benchPost(b, actor.WithMailbox(q.Mailbox()), stalled, func() { _ = q.Resume() }, func() {
					s := q.Stats()
					b.ReportMetric(float64(s.Dropped)/float64(b.N), "dropped/op")
					b.ReportMetric(float64(s.Pauses), "pauses")
				})
			})
		}
	}
	b.Run("protoactor-unbounded/draining", func(b *testing.B) {
		benchPost(b, actor.WithMailbox(actor.Unbounded()), false, nil, func() {})
	})
}

func benchPost(b *testing.B, mailbox actor.PropsOption, stalled bool, resume, report func()) {
	sys := newSystem(b)
	gate := make(chan struct{})
	started := make(chan struct{})
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch msg := ctx.Message().(type) {
		case *actor.Started:
			close(started)
		case *PausedSignal:
			resume() // a reader would catch up first
		case stall:
			<-gate
		case batch:
			_ = msg
		}
	}, mailbox))
	<-started
	if stalled {
		sys.Root.Send(pid, stall{})
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		sys.Root.Send(pid, batch{i})
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "posts/s")
	report()
	close(gate)
	stop(b, sys, pid)
}
