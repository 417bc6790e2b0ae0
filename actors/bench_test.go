package actors

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// benchEvents is the pipeline drain's size; KUMI_BENCH_EVENTS overrides it.
// KUMI_BENCH_TRACE=1 prints the drain's progress every 100 ms.
func benchEvents() int {
	if n, err := strconv.Atoi(os.Getenv("KUMI_BENCH_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 1_000_000
}

// seedBench inserts n events of category "bench" over 10,000 streams
// straight into the tables, as appends of 10 events would have written
// them (append k to stream k mod 10,000, its seq k+1), and sequences them.
func seedBench(b *testing.B, s *eventsource.Store, n int) {
	ctx := context.Background()
	q := s.QuotedSchema()
	require.Zero(b, n%10, "events in appends of 10")
	_, err := s.Pool().Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.appends (seq, stream_name, first_version, last_version, category, cg_hash) OVERRIDING SYSTEM VALUE
SELECT k + 1, 'bench-' || (k %% 10000), (k / 10000) * 10, (k / 10000) * 10 + 9, 'bench', %[1]s.cg_hash((k %% 10000)::text)
FROM generate_series(0, %[2]d / 10 - 1) AS k;
INSERT INTO %[1]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT i / 10 + 1, gen_random_uuid(), 'bench-' || (i / 10 %% 10000), 'bench', (i / 10 %% 10000)::text,
       %[1]s.cg_hash((i / 10 %% 10000)::text), (i / 10 / 10000) * 10 + i %% 10, 'Seeded', jsonb_build_object('i', i)
FROM generate_series(0, %[2]d - 1) AS i ORDER BY i`, q, n))
	require.NoError(b, err)
	_, err = s.Pool().Exec(ctx, "SELECT setval(pg_get_serial_sequence($1, 'seq'), $2)", q+".appends", n/10)
	require.NoError(b, err)
	got, err := s.Sequence(ctx)
	require.NoError(b, err)
	require.Equal(b, n, got)
	_, err = s.Pool().Exec(ctx, "VACUUM ANALYZE "+q+".events")
	require.NoError(b, err)
}

// benchLease is the benchmarks' lease timing, the figures' in
// docs/benchmarks.md: short, for a quiet machine (the tests' fastLease
// leaves room for a loaded one).
func benchLease() leasestore.LeaseOptions {
	return leasestore.LeaseOptions{TTL: 1500 * time.Millisecond, Heartbeat: 150 * time.Millisecond, Margin: 500 * time.Millisecond}
}

// benchWorker is a worker of the benchmarks: its own pool, actor system and
// runtime.
func benchWorker(b *testing.B, schema, name string, o GroupOptions) *testWorker {
	b.Helper()
	w := benchRuntime(b, schema, name)
	w.startGroup(b, o)
	return w
}

// benchRuntime starts a worker's runtime without a group.
func benchRuntime(b *testing.B, schema, name string) *testWorker {
	b.Helper()
	w := &testWorker{name: name, sys: quietSystem(), pool: pgtest.NewPool(b, 24)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(b, err)
	w.rt, err = startedRuntime(context.Background(), w.sys, s, RuntimeOptions{})
	require.NoError(b, err)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = w.rt.Stop(ctx)
	})
	return w
}

func (w *testWorker) startGroup(b *testing.B, o GroupOptions) {
	b.Helper()
	o.Worker = w.name
	g, err := w.rt.StartGroup(context.Background(), o)
	require.NoError(b, err)
	w.group = g
}

func counting(n *atomic.Int64) *actor.Props {
	return actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*Delivery); ok {
			n.Add(1)
			ctx.Respond(Ack{})
		}
	})
}

// BenchmarkPipelineDrain: pre-appended events, 16 buckets, ONE runtime (one
// worker) in this process, a no-op handler; each configuration beside the
// store's read-only 16-bucket drain of the same rows, run just before it, so
// that the two see the same load. Per configuration it reports, as
// benchmark metrics:
//
//   - pct_of_store_drain-<config>: the pipeline's rate as a percentage of the
//     store's drain run beside it — the targets (batched ≥ 80%,
//     one at a time with the defaults ≥ 50%) are read off these;
//   - events/s-<config> and store-events/s-<config>;
//   - cpu_us/event-<config>: this process's CPU time (user and system) per
//     event during the pipeline's drain, which load from other processes
//     barely moves;
//   - peak_rss_MB-<config>: the process's peak RSS during the pipeline's
//     drain (VmHWM, reset before it), beside rss_before_MB-<config>.
//
// KUMI_BENCH_EVENTS (default 1,000,000), KUMI_BENCH_PAGE, KUMI_BENCH_INFLIGHT,
// KUMI_BENCH_BATCH and KUMI_BENCH_WORKERS (default 1) vary it; see
// docs/benchmarks.md.
func BenchmarkPipelineDrain(b *testing.B) {
	ctx := context.Background()
	n := benchEvents()
	store, schema := newTestStore(b)
	seedBench(b, store, n)
	require.NoError(b, store.EnsureConsumerGroupIndex(ctx, 16))
	b.Logf("load average before the drains: %s", loadAverage())
	for _, c := range benchDrains() {
		storeRate, storeTime := storeDrain(b, schema, n)
		var handled atomic.Int64
		o := GroupOptions{Subscription: "drain-" + c.name, Category: "bench", Buckets: 16,
			Handler: counting(&handled), Lease: benchLease(), MaxInFlight: c.inFlight, BatchSize: benchPage()}
		if c.batch > 0 {
			o.Handler, o.Batch.MaxEvents = countingBatches(&handled), c.batch
		}
		if c.fn {
			o.Handler = countingFunc(&handled)
		}
		m := startMemory()
		cpu := processCPU()
		start := time.Now()
		workers := startDrainWorkers(b, schema, o)
		last, lastAt := int64(0), time.Now()
		pgtest.Eventually(b, time.Hour, func() bool {
			if os.Getenv("KUMI_BENCH_TRACE") != "" && time.Since(lastAt) > 100*time.Millisecond {
				h := handled.Load()
				fmt.Printf("  %v: %d handled, %.0f/s\n", time.Since(start).Round(time.Millisecond), h, float64(h-last)/time.Since(lastAt).Seconds())
				last, lastAt = h, time.Now()
			}
			return handled.Load() >= int64(n)
		}, "drained")
		pipeTime := time.Since(start)
		cpuPerEvent := (processCPU() - cpu) / time.Duration(n)
		peak, before := m.peak()
		pipeRate := float64(n) / pipeTime.Seconds()
		pct := 100 * pipeRate / storeRate
		b.ReportMetric(storeRate, "store-events/s-"+c.name)
		b.ReportMetric(pipeRate, "events/s-"+c.name)
		b.ReportMetric(pct, "pct_of_store_drain-"+c.name)
		b.ReportMetric(float64(cpuPerEvent.Nanoseconds())/1000, "cpu_us/event-"+c.name)
		b.ReportMetric(float64(peak)/1024, "peak_rss_MB-"+c.name)
		b.ReportMetric(float64(before)/1024, "rss_before_MB-"+c.name)
		b.Logf("%s, 16 buckets, %d worker(s), no-op handler: %.0f events/s (%v), %.0f%% of the store's drain beside it "+
			"(%.0f events/s, %v); %.1f µs of this process's CPU per event; peak RSS %.0f MB (%.0f MB before)",
			c, len(workers), pipeRate, pipeTime.Round(time.Millisecond), pct, storeRate, storeTime.Round(time.Millisecond),
			float64(cpuPerEvent.Nanoseconds())/1000, float64(peak)/1024, float64(before)/1024)
		stopWorkers(workers)
	}
	b.Logf("load average after the drains: %s", loadAverage())
}

// storeDrain is the store's read-only drain: 16 readers read their buckets
// in parallel, on a new pool, as a worker's is: both drains start on cold
// connections.
func storeDrain(b *testing.B, schema string, n int) (rate float64, took time.Duration) {
	ctx := context.Background()
	reader, err := eventsource.New(pgtest.NewPool(b, 24), eventsource.Config{Schema: schema})
	require.NoError(b, err)
	start := time.Now()
	var wg sync.WaitGroup
	var read atomic.Int64
	for m := 0; m < 16; m++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var after int64
			for {
				evs, err := reader.ReadBucket(ctx, "bench", m, 16, after, benchPage())
				if err != nil || len(evs) == 0 {
					return
				}
				read.Add(int64(len(evs)))
				after = evs[len(evs)-1].Position
			}
		}()
	}
	wg.Wait()
	took = time.Since(start)
	require.Equal(b, int64(n), read.Load())
	reader.Pool().Close()
	return float64(n) / took.Seconds(), took
}

// startDrainWorkers starts KUMI_BENCH_WORKERS runtimes (default 1), each
// with the group, all at once, as a pool would: each joins the membership
// before its first pass, so each claims its share at once.
func startDrainWorkers(b *testing.B, schema string, o GroupOptions) []*testWorker {
	n := 1
	if v, err := strconv.Atoi(os.Getenv("KUMI_BENCH_WORKERS")); err == nil && v > 0 {
		n = v
	}
	workers := make([]*testWorker, n)
	for i := range workers {
		workers[i] = benchRuntime(b, schema, fmt.Sprintf("w%d", i))
	}
	var starting sync.WaitGroup
	errs := make([]error, n)
	for i, w := range workers {
		starting.Add(1)
		go func() {
			defer starting.Done()
			wo := o
			wo.Worker = w.name
			w.group, errs[i] = w.rt.StartGroup(context.Background(), wo)
		}()
	}
	starting.Wait()
	require.NoError(b, errors.Join(errs...))
	return workers
}

// stopWorkers stops the workers' runtimes and closes their pools, so that
// the next configuration starts from a quiet process.
func stopWorkers(workers []*testWorker) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, w := range workers {
		_ = w.rt.Stop(ctx)
		w.pool.Close()
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memoryWindow measures the process's peak RSS from its start.
type memoryWindow struct{ before int64 }

// startMemory returns what the heap held to the system and resets the
// process's peak RSS (VmHWM) to its RSS now (/proc/self/clear_refs, 5).
func startMemory() memoryWindow {
	runtime.GC()
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	return memoryWindow{before: procStatusKB("VmRSS")}
}

// peak returns the peak RSS since startMemory, and the RSS then, in KiB.
func (m memoryWindow) peak() (peak, before int64) { return procStatusKB("VmHWM"), m.before }

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// BenchmarkLiveLatency: append → handler start, at a steady 1,000 events/s.
func BenchmarkLiveLatency(b *testing.B) {
	ctx := context.Background()
	store, schema := newTestStore(b)
	var mu sync.Mutex
	var lat []time.Duration
	handler := actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			if ns, err := strconv.ParseInt(string(d.Event.Data), 10, 64); err == nil {
				mu.Lock()
				lat = append(lat, time.Since(time.Unix(0, ns)))
				mu.Unlock()
			}
			ctx.Respond(Ack{})
		}
	})
	w := benchWorker(b, schema, "a", GroupOptions{Subscription: "live", Category: "live", Buckets: 8, Handler: handler, Lease: benchLease()})
	pgtest.Eventually(b, time.Minute, func() bool { return len(w.owned()) == 8 }, "owns every bucket")
	const rate, seconds = 1000, 5
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for i := 0; i < rate*seconds; i++ {
		<-tick.C
		go func() {
			_, err := store.Append(ctx, fmt.Sprintf("live-%d", i%500), eventsource.Any,
				[]eventsource.EventData{{Type: "Tick", Data: []byte(strconv.FormatInt(time.Now().UnixNano(), 10))}})
			if err != nil {
				b.Error(err)
			}
		}()
	}
	pgtest.Eventually(b, time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return len(lat) == rate*seconds }, "all handled")
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99, pmax := lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	b.Logf("live latency append→handler at %d events/s for %ds (one worker in-process with the appender; a remote appender adds the sequencer's poll, 5–50 ms): p50 %v, p99 %v, max %v",
		rate, seconds, p50, p99, pmax)
}

// BenchmarkRebalance: a join's convergence and a graceful handoff, and the
// failover after a hard kill, for both lease kinds.
func BenchmarkRebalance(b *testing.B) {
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		b.Run(kind.String(), func(b *testing.B) {
			_, schema := newTestStore(b)
			lease := leasestore.LeaseOptions{Kind: kind, TTL: 3 * time.Second, Heartbeat: 500 * time.Millisecond, Margin: time.Second}
			var n atomic.Int64
			o := GroupOptions{Subscription: "rebalance", Category: "acct", Buckets: 32, Handler: counting(&n), Lease: lease}
			a := benchWorker(b, schema, "a", o)
			pgtest.Eventually(b, time.Minute, func() bool { return len(a.owned()) == 32 }, "a owns all")
			start := time.Now()
			bw := benchWorker(b, schema, "b", o)
			pgtest.Eventually(b, time.Minute, func() bool { return fairSplit(32, a, bw) }, "b joins")
			join := time.Since(start)
			start = time.Now()
			c := benchWorker(b, schema, "c", o)
			pgtest.Eventually(b, time.Minute, func() bool { return fairSplit(32, a, bw, c) }, "c joins")
			join3 := time.Since(start)
			start = time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			require.NoError(b, c.group.Stop(ctx))
			cancel()
			pgtest.Eventually(b, time.Minute, func() bool { return fairSplit(32, a, bw) }, "c leaves gracefully")
			leave := time.Since(start)
			start = time.Now()
			bw.group.Abort()
			pgtest.Eventually(b, time.Minute, func() bool { return len(a.owned()) == 32 }, "a takes over after the kill")
			failover := time.Since(start)
			b.ReportMetric(join.Seconds()*1000, "join-ms")
			b.ReportMetric(leave.Seconds()*1000, "leave-ms")
			b.ReportMetric(failover.Seconds()*1000, "failover-ms")
			b.Logf("%s lease, N=32, ttl 3s, heartbeat 500ms: 2nd worker joins (fair split) in %v, 3rd in %v; graceful leave rebalanced in %v; hard kill failed over in %v",
				kind, join, join3, leave, failover)
		})
	}
}

// benchPage is the page size of both drains: the readers' BatchSize and
// the store drain's page; KUMI_BENCH_PAGE overrides the default, 100.
func benchPage() int {
	if n, err := strconv.Atoi(os.Getenv("KUMI_BENCH_PAGE")); err == nil && n > 0 {
		return n
	}
	return BatchSizeDefault
}

// benchDrain is one configuration of the pipeline drain.
type benchDrain struct {
	name     string
	inFlight int
	batch    int  // Batch.MaxEvents; 0: one event per delivery
	fn       bool // a function handler (actors.Func) instead of an actor
}

func (c benchDrain) String() string {
	if c.batch > 0 {
		return fmt.Sprintf("batches of up to %d events", c.batch)
	}
	if c.fn {
		return "one at a time, a function handler, MaxInFlight 1"
	}
	return fmt.Sprintf("one at a time, MaxInFlight %d", c.inFlight)
}

// benchDrains is the configurations the drain runs with: MaxInFlight 1
// and 32, one event per delivery, and batches of up to 500 events.
// KUMI_BENCH_INFLIGHT (one number) narrows the first to that MaxInFlight;
// KUMI_BENCH_BATCH sets the batch size, 0 leaving the batched drain out.
func benchDrains() []benchDrain {
	inFlight := []int{1, 32}
	if n, err := strconv.Atoi(os.Getenv("KUMI_BENCH_INFLIGHT")); err == nil && n > 0 {
		inFlight = []int{n}
	}
	var out []benchDrain
	for _, n := range inFlight {
		out = append(out, benchDrain{name: fmt.Sprintf("inflight-%d", n), inFlight: n})
	}
	out = append(out, benchDrain{name: "func", inFlight: 1, fn: true})
	batch := 500
	if n, err := strconv.Atoi(os.Getenv("KUMI_BENCH_BATCH")); err == nil && n >= 0 {
		batch = n
	}
	if batch > 0 {
		out = append(out, benchDrain{name: fmt.Sprintf("batch-%d", batch), inFlight: 1, batch: batch})
	}
	if only := os.Getenv("KUMI_BENCH_ONLY"); only != "" {
		out = slices.DeleteFunc(out, func(c benchDrain) bool { return !strings.Contains(c.name, only) })
	}
	return out
}

// countingFunc is counting as a function handler.
func countingFunc(n *atomic.Int64) *actor.Props {
	return Func(func(context.Context, *Delivery) error {
		n.Add(1)
		return nil
	})
}

// countingBatches is counting for batched deliveries.
func countingBatches(n *atomic.Int64) *actor.Props {
	return BatchFunc(func(_ context.Context, b *Batch) error {
		n.Add(int64(len(b.Events)))
		return nil
	})
}

// BenchmarkSlowHandlerMemory: a backlog (KUMI_BENCH_SLOW_EVENTS, default
// 200,000) and live appends (about 2,000 events/s) over 16 buckets, one
// runtime, a handler that takes 5 ms per event — far slower than the
// backlog and the appends arrive — for KUMI_BENCH_SLOW_SECONDS (default 10),
// one event at a time and in batches of 500. It reports the process's peak
// RSS over that time (peak_rss_MB-<config>), which the readers' bounds hold
// whatever the backlog: each reader holds at most about 2 × BatchSize events
// read ahead, MaxInFlight (or one batch of Batch.MaxEvents) with the
// handler, and a queue of live batches bounded by QueueCapacity and
// QueueBytes (see docs/operations.md, Memory).
func BenchmarkSlowHandlerMemory(b *testing.B) {
	ctx := context.Background()
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("KUMI_BENCH_SLOW_EVENTS")); err == nil && v > 0 {
		n = v
	}
	seconds := 10
	if v, err := strconv.Atoi(os.Getenv("KUMI_BENCH_SLOW_SECONDS")); err == nil && v > 0 {
		seconds = v
	}
	store, schema := newTestStore(b)
	seedBench(b, store, n)
	require.NoError(b, store.EnsureConsumerGroupIndex(ctx, 16))
	const work = 5 * time.Millisecond
	for _, c := range []benchDrain{{name: "inflight-1", inFlight: 1}, {name: "batch-500", inFlight: 1, batch: 500}} {
		var handled atomic.Int64
		o := GroupOptions{Subscription: "slow-" + c.name, Category: "bench", Buckets: 16, Lease: benchLease(),
			Handler: Func(func(context.Context, *Delivery) error {
				time.Sleep(work)
				handled.Add(1)
				return nil
			})}
		if c.batch > 0 {
			o.Batch.MaxEvents = c.batch
			o.Handler = BatchFunc(func(_ context.Context, bt *Batch) error {
				time.Sleep(work * time.Duration(len(bt.Events)))
				handled.Add(int64(len(bt.Events)))
				return nil
			})
		}
		m := startMemory()
		workers := startDrainWorkers(b, schema, o)
		stop := make(chan struct{})
		var appending sync.WaitGroup
		appending.Add(1)
		go func() { // about 2,000 events/s: 20 appends of 10 events every 100 ms
			defer appending.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			evs := make([]eventsource.EventData, 10)
			for i := range evs {
				evs[i] = eventsource.EventData{Type: "Live", Data: []byte(`{"live":true}`)}
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				for j := range 20 {
					// Streams of their own: the seeded ones bypassed the stream table.
					if _, err := store.Append(ctx, fmt.Sprintf("bench-live%d", (i*20+j)%1000), eventsource.Any, evs); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
		deadline := time.NewTimer(time.Duration(seconds) * time.Second)
		<-deadline.C
		close(stop)
		appending.Wait()
		peak, before := m.peak()
		b.ReportMetric(float64(peak)/1024, "peak_rss_MB-"+c.name)
		b.ReportMetric(float64(before)/1024, "rss_before_MB-"+c.name)
		b.Logf("slow handler (5 ms per event), %s, 16 buckets, backlog %d, live appends ~2,000/s, %ds: %d handled; "+
			"peak RSS %.0f MB (%.0f MB before)", c, n, seconds, handled.Load(), float64(peak)/1024, float64(before)/1024)
		stopWorkers(workers)
	}
}
