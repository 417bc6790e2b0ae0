package actors

import (
	"sync"
	"time"
)

// dispatcher runs mailboxes on a few long-lived goroutines instead of a
// new goroutine per run, as protoactor's default dispatcher does. A new
// goroutine starts with a small stack and grows it (copying) on every run;
// a reused one has grown once. When every worker is busy, a run gets a
// goroutine of its own, so a slow handler never holds up another actor.
// Idle workers end after a while, and all of them on close.
type dispatcher struct {
	work       chan func()
	throughput int
	idle       time.Duration

	mu      sync.Mutex
	workers int
	max     int
	closed  bool
	done    chan struct{}
	wg      sync.WaitGroup
}

func newDispatcher(maxWorkers, throughput int) *dispatcher {
	return &dispatcher{work: make(chan func()), throughput: throughput, idle: 5 * time.Second,
		max: maxWorkers, done: make(chan struct{})}
}

// Schedule runs fn on an idle worker, a new worker (up to the limit), or a
// goroutine of its own.
func (d *dispatcher) Schedule(fn func()) {
	select {
	case d.work <- fn:
		return
	default:
	}
	d.mu.Lock()
	if !d.closed && d.workers < d.max {
		d.workers++
		d.wg.Add(1)
		d.mu.Unlock()
		go d.worker(fn)
		return
	}
	d.mu.Unlock()
	go fn()
}

// Throughput is how many messages a mailbox processes per run.
func (d *dispatcher) Throughput() int { return d.throughput }

func (d *dispatcher) worker(fn func()) {
	defer d.wg.Done()
	t := time.NewTimer(d.idle)
	defer t.Stop()
	for {
		fn()
		t.Reset(d.idle)
		select {
		case fn = <-d.work:
		case <-t.C:
			d.mu.Lock()
			d.workers--
			d.mu.Unlock()
			return
		case <-d.done:
			return
		}
	}
}

// close ends the idle workers and waits for them; runs under way finish
// first. Later runs get goroutines of their own.
func (d *dispatcher) close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	close(d.done)
	d.mu.Unlock()
	d.wg.Wait()
}
