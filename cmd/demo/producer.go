package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/kumi-run/kumi/eventsource"
)

// producer appends events to the demo's category at a steady rate, one
// event per append, each to a random stream of the category.
type producer struct {
	store    *eventsource.Store
	category string
	rate     int
	streams  int

	appended atomic.Int64
	failed   atomic.Int64
	mu       sync.Mutex
	lastErr  error

	cancel context.CancelFunc
	done   chan struct{}
}

func newProducer(store *eventsource.Store, category string, rate, streams int) *producer {
	return &producer{store: store, category: category, rate: rate, streams: streams}
}

// start begins appending; stop ends it.
func (p *producer) start() {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan struct{})
	go p.run(ctx)
}

// stop stops appending and waits for the append in flight.
func (p *producer) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
}

// err returns the last append error (nil if none).
func (p *producer) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

func (p *producer) run(ctx context.Context) {
	defer close(p.done)
	tracer := otel.Tracer("github.com/kumi-run/kumi/cmd/demo")
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var sent int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := int64(time.Since(start).Seconds()*float64(p.rate)) - sent
		if limit := int64(p.rate); due > limit {
			// Far behind (a slow database): let the excess go rather than
			// burst it.
			sent += due - limit
			due = limit
		}
		for range due {
			if ctx.Err() != nil {
				return
			}
			sent++
			stream := fmt.Sprintf("%s-%d", p.category, rand.IntN(p.streams))
			// A span per append: the workers' delivery spans join its
			// trace through the event's metadata.
			// The append is not cut short by stop: an append cancelled
			// mid-flight can still commit after stop returned, and the
			// final check would count an event nobody waited for.
			actx, span := tracer.Start(context.Background(), "demo.append")
			actx, cancelAppend := context.WithTimeout(actx, 10*time.Second)
			_, err := p.store.Append(actx, stream, eventsource.Any, []eventsource.EventData{{
				Type: "Deposited",
				Data: fmt.Appendf(nil, `{"n":%d,"amount":%d}`, sent, 1+rand.IntN(100)),
			}})
			cancelAppend()
			span.End()
			if err != nil {
				p.failed.Add(1)
				p.mu.Lock()
				p.lastErr = err
				p.mu.Unlock()
				continue
			}
			p.appended.Add(1)
		}
	}
}
