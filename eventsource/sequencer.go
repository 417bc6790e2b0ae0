package eventsource

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// SequencerOptions tune a [Sequencer]. Zero values mean defaults.
type SequencerOptions struct {
	// MinInterval is the poll interval right after work was found, and
	// also the least time between two steps, so that a busy store is
	// sequenced in batches rather than one transaction per append.
	// MaxInterval is the interval it backs off to while idle. Appends made
	// through this process's Store wake the sequencer at once (at most
	// MinInterval after its last step); appends from other processes are
	// found by polling. Defaults 5 ms and 50 ms.
	MinInterval, MaxInterval time.Duration
	// Logger receives errors at Warn; nil discards.
	Logger *slog.Logger
}

// Sequencer runs [Store.Sequence] in the background: at once after a local
// append, and by polling for other processes' appends. Run one per process
// that appends or subscribes; several across processes cooperate (one
// sequences at a time, the others skip).
type Sequencer struct {
	store *Store
	opts  SequencerOptions

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewSequencer returns a stopped sequencer for store.
func NewSequencer(store *Store, opts SequencerOptions) *Sequencer {
	if opts.MinInterval <= 0 {
		opts.MinInterval = 5 * time.Millisecond
	}
	if opts.MaxInterval < opts.MinInterval {
		opts.MaxInterval = 50 * time.Millisecond
		if opts.MaxInterval < opts.MinInterval {
			opts.MaxInterval = opts.MinInterval
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sequencer{store: store, opts: opts}
}

// Start runs the sequencer until Stop. It returns at once; calling it on a
// running sequencer does nothing.
func (q *Sequencer) Start() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	q.cancel, q.done = cancel, make(chan struct{})
	go q.run(ctx, q.done)
}

// Stop stops the sequencer and waits for it. It is idempotent.
func (q *Sequencer) Stop() {
	q.mu.Lock()
	cancel, done := q.cancel, q.done
	q.cancel, q.done = nil, nil
	q.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

func (q *Sequencer) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	interval := q.opts.MinInterval
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last time.Time
	for {
		local := false
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-q.store.appended:
			local = true
		}
		// At most one step per MinInterval: a busy store is sequenced in
		// batches, not one round trip per append.
		if wait := q.opts.MinInterval - time.Since(last); wait > 0 && !sleepCtx(ctx, wait) {
			return
		}
		last = time.Now()
		n, err := q.step(ctx, local)
		switch {
		case err != nil && ctx.Err() == nil:
			q.opts.Logger.Warn("kumi: sequencer step failed", "err", err)
			interval = q.opts.MaxInterval
		case n > 0:
			interval = q.opts.MinInterval
		default:
			interval = min(interval*2, q.opts.MaxInterval)
		}
		timer.Reset(interval)
	}
}

// step sequences what is pending. After a local append there is work for
// sure; otherwise a cheap look first saves a transaction when idle.
func (q *Sequencer) step(ctx context.Context, local bool) (int, error) {
	if !local {
		var pending bool
		if err := q.store.pool.QueryRow(ctx, q.store.sql.sequencerPending).Scan(&pending); err != nil {
			return 0, err
		}
		if !pending {
			return 0, nil
		}
	}
	return q.store.Sequence(ctx)
}
