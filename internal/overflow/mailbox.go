package overflow

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Mailbox returns a protoactor mailbox producer whose user messages go
// through q: batches are bounded by q's policy as they are posted, and
// everything else — acks, timers, control, PoisonPill — passes unbounded.
// System messages (stop, restart, watch, suspend/resume) have their own
// unbounded queue and, as in protoactor's own mailboxes, go first.
//
// Unlike protoactor's Bounded and BoundedDropping, posting never blocks or
// spins, a refused batch schedules no work, and the mailbox goes idle as
// soon as nothing is deliverable.
//
// One Queue serves one actor: spawn the returned producer once. (A spawn
// that fails before the actor starts, e.g. on a taken name, may be retried.)
// Middlewares are called as protoactor's mailboxes call them.
func (q *Queue) Mailbox(middlewares ...actor.MailboxMiddleware) actor.MailboxProducer {
	return func() actor.Mailbox {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.mb != nil && q.mb.started.Load() {
			panic("overflow: a Queue's mailbox was spawned twice; create one Queue per actor")
		}
		q.mb = nil // registered again by RegisterHandlers
		m := &mailbox{q: q, middlewares: middlewares}
		m.processFn = m.process // one func value for every schedule, not one allocation each
		return m
	}
}

const (
	idle int32 = iota
	running
)

// mailbox is actor.Mailbox over a Queue. Its scheduling follows protoactor's
// defaultMailbox, with one difference that matters: whether there is work
// is decided by the queue's contents, not by a separate counter, so a
// dropped message can never leave the mailbox believing it has work.
type mailbox struct {
	q           *Queue
	middlewares []actor.MailboxMiddleware
	invoker     actor.MessageInvoker
	dispatcher  actor.Dispatcher
	processFn   func() // m.process, made once

	sysMu sync.Mutex
	sys   ring[any]
	sysN  atomic.Int32

	status    atomic.Int32
	suspended atomic.Bool
	started   atomic.Bool
}

var _ actor.Mailbox = (*mailbox)(nil)

func (m *mailbox) PostUserMessage(message any) {
	// protoactor's mailboxes unpack a MessageBatch into its messages, then
	// post the batch itself too; do the same.
	if b, ok := message.(actor.MessageBatch); ok {
		for _, msg := range b.GetMessages() {
			m.PostUserMessage(msg)
		}
	}
	if env, ok := message.(*actor.MessageEnvelope); ok {
		if b, ok := env.Message.(actor.MessageBatch); ok {
			for _, msg := range b.GetMessages() {
				m.PostUserMessage(msg)
			}
		}
	}
	for _, mw := range m.middlewares {
		mw.MessagePosted(message)
	}
	if _, wake := m.q.offer(message); wake {
		m.schedule()
	}
}

func (m *mailbox) PostSystemMessage(message any) {
	for _, mw := range m.middlewares {
		mw.MessagePosted(message)
	}
	m.sysMu.Lock()
	m.sys.push(message)
	m.sysMu.Unlock()
	m.sysN.Add(1)
	m.schedule()
}

func (m *mailbox) popSystem() (any, bool) {
	if m.sysN.Load() == 0 {
		return nil, false
	}
	m.sysMu.Lock()
	msg, ok := m.sys.pop()
	m.sysMu.Unlock()
	if ok {
		m.sysN.Add(-1)
	}
	return msg, ok
}

func (m *mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker = invoker
	m.dispatcher = dispatcher
	m.q.mu.Lock()
	m.q.mb = m // from now on Release may schedule this mailbox
	m.q.mu.Unlock()
}

func (m *mailbox) Start() {
	m.started.Store(true)
	for _, mw := range m.middlewares {
		mw.MailboxStarted()
	}
}

// UserMessageCount returns the number of queued user messages, held
// batches included.
func (m *mailbox) UserMessageCount() int { return m.q.Len() }

func (m *mailbox) schedule() {
	if m.status.CompareAndSwap(idle, running) {
		m.dispatcher.Schedule(m.processFn)
	}
}

// hasWork reports whether run would do anything now.
func (m *mailbox) hasWork() bool {
	return m.sysN.Load() > 0 || (!m.suspended.Load() && m.q.deliverable())
}

func (m *mailbox) process() {
	for {
		m.run()
		m.status.Store(idle)
		// A message posted after run saw an empty queue found the mailbox
		// running and did not schedule it: look again.
		if !m.hasWork() || !m.status.CompareAndSwap(idle, running) {
			break
		}
	}
	if len(m.middlewares) > 0 && !m.suspended.Load() && !m.q.deliverable() {
		for _, mw := range m.middlewares {
			mw.MailboxEmpty()
		}
	}
}

func (m *mailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()

	throughput := m.dispatcher.Throughput()
	for i := 0; ; i++ {
		if i > throughput {
			i = 0
			runtime.Gosched()
		}
		var ok bool
		if msg, ok = m.popSystem(); ok {
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended.Store(true)
			case *actor.ResumeMailbox:
				m.suspended.Store(false)
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
			for _, mw := range m.middlewares {
				mw.MessageReceived(msg)
			}
			continue
		}
		if m.suspended.Load() {
			return
		}
		if msg, ok = m.q.Pop(); !ok {
			return
		}
		m.invoker.InvokeUserMessage(msg)
		for _, mw := range m.middlewares {
			mw.MessageReceived(msg)
		}
	}
}
