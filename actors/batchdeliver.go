package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/checkpointing"
)

// Batched deliveries (GroupOptions.Batch) go through the window's state
// machine (see windowed.go and internal/window): a batch is one slot of
// it (MaxInFlight is 1) whose delivery is its first event's. What is left
// here serves function handlers' runs (funcrun.go), which still thread
// their window by hand.

// eventSize is what an event counts against Batch.MaxBytes.
func eventSize(e eventsource.RecordedEvent) int { return len(e.Data) + len(e.Metadata) }

// unbatch gives the events of an entry's batch after its first back to the
// front of the pending list, in order.
func (r *reader) unbatch(s *entry) {
	if len(s.batch) > 1 {
		r.feed.PutBack(s.batch[1:])
	}
	s.batch = nil
}

// ackPrefix moves the acked position over the first done events of s's
// batch or run (committed: their checkpoint is written already, by the
// handler's exactly-once commit) and makes the rest s's next delivery, a
// first attempt of its head event under a new id. The entry is the
// window's only one (MaxInFlight 1), so the acked position moves over the
// prefix.
func (r *reader) ackPrefix(ctx actor.Context, s *entry, done int, committed bool) {
	a := checkpointing.Ack{Through: s.batch[done-1].Position, Events: done}
	if committed {
		a.Committed = a.Through
	}
	r.cpDo(ctx, r.cp.Finished(a))
	delete(r.win.byID, s.d.id)
	delete(r.win.busy, s.d.Event.Stream)
	head := *s.d
	head.Event, head.Attempt, head.id = s.batch[done], 0, answerIDs.Add(1)
	s.d, s.free, s.batch = &head, 0, s.batch[done:]
	r.win.byID[head.id], r.win.busy[head.Event.Stream] = s, true
}
