package overflow

import (
	"sync"
)

// Queue is a FIFO of messages that bounds only batches (see [Batch]) — in
// number ([Config.Capacity]) and in bytes ([Config.MaxBytes], and a
// [Budget] shared with other queues) — and applies a [Policy] when a batch
// finds it full. Posting never blocks: a
// batch is accepted, rejected or makes room by eviction under one short
// lock. Every other message is accepted unbounded. Messages come out in the
// order they were posted, except that batches stay queued while the queue is
// held (see [Queue.Hold]).
//
// A Queue is safe for concurrent use by many posters and one consumer. It is
// used either directly (Push / Pop) or as an actor's mailbox through
// [Queue.Mailbox] — not both.
type Queue struct {
	capacity     int
	maxBytes     int64
	budget       *Budget
	policy       Policy
	isBatch      func(any) bool
	onTransition func(Transition)

	mu      sync.Mutex
	batches ring[entry] // bounded by capacity
	others  ring[entry] // unbounded: everything that is not a batch
	seq     uint64      // post order across both rings
	state   State
	held    bool
	closed  bool
	bytes   int64 // the sizes of the queued batches, all charged to budget
	err     *OverflowError
	mb      *mailbox // set once the mailbox's handlers are registered

	posted, delivered, dropped, evicted uint64
	pauses, resumes, overflows          uint64
}

type entry struct {
	seq  uint64
	size int64 // a batch's size (see Sized)
	msg  any
}

// Stats is a snapshot of a [Queue]. Batch counters satisfy
// Posted = Delivered + Dropped + Depth.
type Stats struct {
	State    State
	Held     bool
	Capacity int
	// MaxBytes is the queue's byte bound, 0 if none.
	MaxBytes int64
	// Depth is the number of queued batches; Len the number of queued
	// messages of every kind.
	Depth, Len int
	// Bytes is the size of the queued batches (see [Sized]).
	Bytes int64
	// Posted counts batches offered; Delivered, batches handed to the
	// consumer; Dropped, batches rejected, evicted or discarded on a pause or
	// overflow; Evicted, the part of Dropped evicted under DropOldest.
	Posted, Delivered, Dropped, Evicted uint64
	// Pauses, Resumes and Overflows count state transitions.
	Pauses, Resumes, Overflows uint64
}

// New returns an empty, active Queue. It fails with a *[kumierr.ConfigError]
// naming the field when cfg is invalid.
func New(cfg Config) (*Queue, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Queue{
		capacity:     cfg.Capacity,
		maxBytes:     cfg.MaxBytes,
		budget:       cfg.Budget,
		policy:       cfg.Policy,
		isBatch:      cfg.IsBatch,
		onTransition: cfg.OnTransition,
	}, nil
}

// Push posts msg and reports whether it was queued. Only a batch can be
// refused: while the queue is paused, overflowed or closed, or when it is
// full under PauseAndResume or DropSubscription (which changes its state),
// or when its [Budget] has no room left and DropOldest has nothing to
// evict.
func (q *Queue) Push(msg any) bool {
	queued, _ := q.offer(msg)
	return queued
}

// offer posts msg and reports whether it was queued and whether the queue
// gained something the consumer can receive now (the mailbox schedules its
// consumer only then).
func (q *Queue) offer(msg any) (queued, wake bool) {
	if !q.isBatch(unwrap(msg)) {
		q.mu.Lock()
		q.pushOther(msg)
		q.mu.Unlock()
		return true, true
	}

	size := sizeOf(unwrap(msg))
	q.mu.Lock()
	defer q.mu.Unlock()
	q.posted++
	if q.state != Active || q.closed {
		q.dropped++
		return false, false
	}
	// The queue's own bounds. A queue that holds no batch takes one of any
	// size: the byte bound limits what waits behind the batch at its head.
	for q.batches.len() >= q.capacity || (q.maxBytes > 0 && q.batches.len() > 0 && q.bytes+size > q.maxBytes) {
		if q.policy != DropOldest {
			bound := BoundBatches
			if q.batches.len() < q.capacity {
				bound = BoundBytes
			}
			return false, q.refuse(bound, size)
		}
		q.evictOldest()
	}
	// The budget shared with other queues: no exception for an empty queue.
	for q.budget != nil && !q.budget.take(size) {
		if q.policy != DropOldest || q.batches.len() == 0 {
			return false, q.refuse(BoundBudget, size)
		}
		q.evictOldest()
	}
	q.seq++
	q.bytes += size
	q.batches.push(entry{seq: q.seq, size: size, msg: msg})
	return true, !q.held
}

// evictOldest drops the oldest queued batch (DropOldest) and reports it
// as a Transition that changes no state; q.mu is held.
func (q *Queue) evictOldest() {
	q.popBatch()
	q.dropped++
	q.evicted++
	if q.onTransition != nil {
		q.onTransition(Transition{From: q.state, To: q.state, Evicted: true, Stats: q.statsLocked()})
	}
}

// popBatch removes the oldest queued batch and returns its bytes to the
// budget; q.mu is held.
func (q *Queue) popBatch() entry {
	e, _ := q.batches.pop()
	q.bytes -= e.size
	q.budget.give(e.size)
	return e
}

// discard drops every queued batch, returns their bytes to the budget and
// counts them dropped; q.mu is held.
func (q *Queue) discard() {
	q.dropped += uint64(q.batches.clear())
	q.budget.give(q.bytes)
	q.bytes = 0
}

// refuse applies the policy to a batch of size that crossed bound: under
// PauseAndResume (and under DropOldest when the shared budget is spent and
// the queue has nothing left to evict) the queue pauses; under
// DropSubscription it overflows. Either way it discards what it holds. It
// reports that the consumer has a signal to receive; q.mu is held.
func (q *Queue) refuse(bound Bound, size int64) bool {
	q.dropped++
	held := q.bytes
	q.discard()
	if q.policy != DropSubscription {
		q.pauses++
		q.pushOther(&PausedSignal{})
		q.transition(Paused)
		return true
	}
	q.overflows++
	q.err = &OverflowError{Capacity: q.capacity, Posted: q.posted, Delivered: q.delivered, Bound: bound, Bytes: held + size}
	switch bound {
	case BoundBytes:
		q.err.Limit = q.maxBytes
	case BoundBudget:
		q.err.Limit = q.budget.Limit()
		q.err.Bytes = q.budget.Used() + held + size
	}
	q.pushOther(&OverflowedSignal{Err: q.err})
	q.transition(Overflowed)
	return true
}

func (q *Queue) pushOther(msg any) {
	q.seq++
	q.others.push(entry{seq: q.seq, msg: msg})
}

// transition moves to state to and reports it; q.mu is held.
func (q *Queue) transition(to State) {
	from := q.state
	q.state = to
	if q.onTransition != nil {
		q.onTransition(Transition{From: from, To: to, Stats: q.statsLocked()})
	}
}

// Pop removes and returns the oldest message the consumer may receive: the
// oldest message, or while the queue is held the oldest message that is not
// a batch. It returns false when there is none.
func (q *Queue) Pop() (any, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o, okOther := q.others.peek()
	b, okBatch := q.batches.peek()
	okBatch = okBatch && !q.held
	switch {
	case okBatch && (!okOther || b.seq < o.seq):
		q.popBatch()
		q.delivered++
		return b.msg, true
	case okOther:
		q.others.pop()
		return o.msg, true
	}
	return nil, false
}

// deliverable reports whether Pop would return a message.
func (q *Queue) deliverable() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.others.len() > 0 || (!q.held && q.batches.len() > 0)
}

// Resume returns a paused queue to [Active] so that it accepts batches
// again. It does nothing to an active queue, and returns the
// [*OverflowError] of an overflowed one, which never resumes.
func (q *Queue) Resume() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch q.state {
	case Overflowed:
		return q.err
	case Paused:
		q.resumes++
		q.transition(Active)
	}
	return nil
}

// Hold keeps batches queued — still bounded, still subject to the policy —
// while other messages keep flowing to the consumer. A consumer holds its
// batches while it catches up from the store, so that live batches wait
// for the catch-up instead of overtaking it; [Queue.Release] ends the hold.
// A queue can be held before its actor is spawned.
func (q *Queue) Hold() {
	q.mu.Lock()
	q.held = true
	q.mu.Unlock()
}

// Close discards the queued batches, returns their bytes to the [Budget],
// and makes the queue drop every batch posted later, silently (counted in
// [Stats.Dropped]). Its consumer calls it when it stops for good, so that
// batches posted to a queue nobody reads do not hold the shared budget.
// Other messages still pass. Close is idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.discard()
}

// Release ends a [Queue.Hold]: queued batches are delivered again, in order.
func (q *Queue) Release() {
	q.mu.Lock()
	q.held = false
	mb, wake := q.mb, q.batches.len() > 0
	q.mu.Unlock()
	if mb != nil && wake {
		mb.schedule()
	}
}

// State returns the queue's current state.
func (q *Queue) State() State {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// Err returns the [*OverflowError] of an overflowed queue, or nil.
func (q *Queue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err == nil {
		return nil
	}
	return q.err
}

// Depth returns the number of queued batches.
func (q *Queue) Depth() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.batches.len()
}

// Len returns the number of queued messages of every kind.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.batches.len() + q.others.len()
}

// Stats returns a consistent snapshot of the queue's counters.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.statsLocked()
}

func (q *Queue) statsLocked() Stats {
	return Stats{
		State:     q.state,
		Held:      q.held,
		Capacity:  q.capacity,
		MaxBytes:  q.maxBytes,
		Depth:     q.batches.len(),
		Bytes:     q.bytes,
		Len:       q.batches.len() + q.others.len(),
		Posted:    q.posted,
		Delivered: q.delivered,
		Dropped:   q.dropped,
		Evicted:   q.evicted,
		Pauses:    q.pauses,
		Resumes:   q.resumes,
		Overflows: q.overflows,
	}
}
