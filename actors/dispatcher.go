package actors

import (
	"context"
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
	// drained is closed once the dispatcher is closed and its last worker
	// has ended.
	drained chan struct{}
}

func newDispatcher(maxWorkers, throughput int) *dispatcher {
	return &dispatcher{work: make(chan func()), throughput: throughput, idle: 5 * time.Second,
		max: maxWorkers, done: make(chan struct{}), drained: make(chan struct{})}
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
	defer d.exit()
	t := time.NewTimer(d.idle)
	defer t.Stop()
	for {
		fn()
		t.Reset(d.idle)
		select {
		case fn = <-d.work:
		case <-t.C:
			return
		case <-d.done:
			return
		}
	}
}

func (d *dispatcher) exit() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.workers--
	if d.closed && d.workers == 0 {
		close(d.drained)
	}
}

// close ends the idle workers and waits until the busy ones have finished
// their runs, or until ctx ends: then it returns ctx.Err() and the number
// of runs still under way, which end on their own when their actors return
// (a handler blocked in a call that ignores its context may never). Later
// runs get goroutines of their own. close may be called again, to wait
// once more.
func (d *dispatcher) close(ctx context.Context) (busy int, err error) {
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		close(d.done)
		if d.workers == 0 {
			close(d.drained)
		}
	}
	d.mu.Unlock()
	select {
	case <-d.drained:
		return 0, nil
	case <-ctx.Done():
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.workers, ctx.Err()
	}
}
