package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/checkpointing"
	"github.com/kumi-run/kumi/observability"
)

// Batched deliveries (GroupOptions.Batch). A batch is one entry of the
// delivery window (MaxInFlight is 1) whose delivery, d, is that of the
// batch's first event: timeouts, probes, handler replacement, retries and
// dead letters act on it as on any entry, and charge the first event. When
// the entry is sent, the events that follow in the pending list join it, up
// to the batch's bounds; when it comes back unfinished, the events after
// its first go back to the front of the pending list, in order, and join
// it again when it is sent next. A batch that fails as a whole without
// saying where (a panic, a timeout, a Retry or another answer than a
// BatchAck) is sent next as its first event alone: an event that breaks
// its batches is then found, and charged, alone, and the events before it
// are not. So the window never holds more than one
// batch, and the checkpoint never passes an unfinished event.

// takeBatch makes the batch of an entry about to be sent: its event and the
// pending events that follow, within Batch's bounds, up to an unreadable
// one (dead-lettered on its own, as the first of an entry).
func (r *reader) takeBatch(s *entry) *Batch {
	o := r.g.opts.Batch
	limit := o.MaxEvents
	if s.alone {
		limit = 1
	}
	pending := r.feed.Pending()
	evs := make([]eventsource.RecordedEvent, 1, min(limit, 1+len(pending)))
	evs[0] = s.d.Event
	size, n := eventSize(s.d.Event), 0
	for ; n < len(pending) && len(evs) < limit; n++ {
		e := pending[n]
		size += eventSize(e)
		if e.Err != nil || (o.MaxBytes > 0 && size > o.MaxBytes) || r.beyondBound(e.Position) {
			break
		}
		evs = append(evs, e)
	}
	r.feed.Take(n)
	s.batch = evs
	d := s.d
	return &Batch{Events: evs, Attempt: d.Attempt, Subscription: d.Subscription, Generation: d.Generation, Bucket: d.Bucket,
		Epoch: d.Epoch, Fence: d.Fence, Context: d.Context, d: d}
}

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

// settleBatch applies a batch's answer. The events it says are done are
// acked (the whole batch: the entry finishes, and settled is true).
// Otherwise the first event not done becomes the entry's, a new delivery
// with its own attempts, the events after it go back to pending, and next
// is the answer for it: what BatchAck.Next says, or, for anything but a
// BatchAck (a Retry, a panic, a timeout), a retry of the whole batch.
func (r *reader) settleBatch(ctx actor.Context, s *entry, res any) (next any, settled bool) {
	m := classifyBatchAnswer(res, len(s.batch))
	if m.warn != "" {
		r.warnAnswer(m.warn, s.d, res)
	}
	switch {
	case m.alone:
		return r.batchFailed(s, m.next)
	case m.all:
		s.span.End(observability.OutcomeAck, nil)
		r.finish(ctx, s, m.committed)
		return nil, true
	case m.done > 0:
		// The prefix is done. The entry is the window's only one, so the
		// acked position moves over it.
		r.ackPrefix(ctx, s, m.done, m.committed)
		s.alone = false
	}
	r.unbatch(s)
	return m.next, false
}

// batchFailed: the batch failed as a whole, without saying where. It is
// retried (answer says why) with its first event alone. A batch of more
// than one event fails at no event's charge (the attempt is free): the
// first event's own failures, alone, are charged, so that no event before
// the one at fault spends its budget
// (TestBatchedDeliveries/ABatchFailedAsAWholeIsChargedToNoEventOfIt).
func (r *reader) batchFailed(s *entry, answer any) (any, bool) {
	if len(s.batch) > 1 {
		s.free++
	}
	r.unbatch(s)
	s.alone = true
	return answer, false
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
