package window

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkWindow drives a window as a bucket reader does in
// actors' BenchmarkPipelineDrain, without the actor system, the store or
// a clock: events of 625 streams in turn (the benchmark's 10,000 streams
// over 16 buckets), taken as the window has room, each lease check held,
// and each delivery acked, in the order sent. It reports ns/event: the
// window's own cost per event handled.
func BenchmarkWindow(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  Config
		runs bool
	}{
		{"inflight-1", Config{MaxInFlight: 1}, false},
		{"inflight-32", Config{MaxInFlight: 32}, false},
		{"func", Config{MaxInFlight: 1, RunEvents: 256}, true},
		{"batch-500", Config{MaxInFlight: 1, Batch: Batch{MaxEvents: 500}}, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			c.cfg.MaxAttempts, c.cfg.Timeout, c.cfg.ProbeWait = 5, 30*time.Second, time.Second
			d := newBenchDriver(c.cfg)
			b.ReportAllocs()
			b.ResetTimer()
			d.run(b.N)
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/event")
		})
	}
}

// benchDriver plays the reader around a window: a pending list (the
// events after the window's), the deliveries out, in the order sent.
type benchDriver struct {
	s       *State
	streams []string
	next    int64 // the position of the first pending event
	pending []Event
	buf     []Event // pending's array
	obuf    []Send  // out's
	out     []Send
	handled int
	now     time.Time
}

func newBenchDriver(cfg Config) *benchDriver {
	d := &benchDriver{s: New(cfg), next: 1, now: time.Unix(0, 0), buf: make([]Event, 8192)}
	d.pending, d.obuf = d.buf[:0], make([]Send, 1024)
	d.out = d.obuf[:0]
	for i := range 625 {
		d.streams = append(d.streams, fmt.Sprintf("bench-%d", i*16))
	}
	return d
}

// fill makes the pending list n events long at least (a reader's page).
func (d *benchDriver) fill(n int) {
	for len(d.pending) < n {
		d.pending = append(d.pending, Event{Pos: d.next, Stream: d.streams[d.next%int64(len(d.streams))], Size: 100})
		d.next++
	}
}

// drop drops the first n pending events; the list's array is reused.
func (d *benchDriver) drop(n int) {
	d.pending = d.pending[n:]
	if cap(d.pending) < 1024 {
		k := copy(d.buf, d.pending)
		d.pending = d.buf[:k]
	}
}

// do carries out e as the reader does: the finished prefix counted, the
// deliveries queued, a lease check answered held at once, given the
// pending list when the window may take from it (batches, runs).
func (d *benchDriver) do(e Effects) {
	d.handled += e.Finished.Events
	if e.Absorbed > 0 {
		d.drop(e.Absorbed)
	}
	d.out = append(d.out, e.Sends...)
	if e.CheckLease {
		var pending []Event
		if d.s.cfg.Batch.on() || d.s.Runs() {
			d.fill(512)
			pending = d.pending
		}
		d.do(d.s.Lease(d.now, true, pending))
	}
}

// run handles n events at least.
func (d *benchDriver) run(n int) {
	for d.handled < n {
		if room := d.s.Room(); room > 0 {
			d.fill(room)
			took, e := d.s.Take(d.pending[:room])
			d.drop(took)
			d.do(e)
		}
		if len(d.out) == 0 {
			panic("nothing out")
		}
		s := d.out[0]
		if d.out = d.out[1:]; cap(d.out) < 64 {
			k := copy(d.obuf, d.out)
			d.out = d.obuf[:k]
		}
		switch {
		case s.Run != 0:
			d.do(d.s.RunAnswered(d.now, RunOutcome{Run: s.Run, Done: len(s.Events)}))
		case s.Events != nil:
			d.do(d.s.Answered(d.now, Answer{ID: s.ID, Attempt: s.Attempt, Outcome: BatchAcked, Done: len(s.Events)}))
		default:
			d.do(d.s.Answered(d.now, Answer{ID: s.ID, Attempt: s.Attempt, Runs: d.s.cfg.RunEvents > 0}))
		}
	}
}
