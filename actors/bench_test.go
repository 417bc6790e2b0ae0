package actors

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
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
// straight into the table (as appends would have written them) and
// sequences them.
func seedBench(b *testing.B, s *eventsource.Store, n int) {
	ctx := context.Background()
	q := s.QuotedSchema()
	_, err := s.Pool().Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.events (event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT gen_random_uuid(), 'bench-' || (i %% 10000), 'bench', (i %% 10000)::text, %[1]s.cg_hash((i %% 10000)::text),
       i / 10000, 'Seeded', jsonb_build_object('i', i)
FROM generate_series(0, %[2]d - 1) AS i ORDER BY i`, q, n))
	require.NoError(b, err)
	got, err := s.Sequence(ctx)
	require.NoError(b, err)
	require.Equal(b, n, got)
	_, err = s.Pool().Exec(ctx, "VACUUM ANALYZE "+q+".events")
	require.NoError(b, err)
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
	w.rt, err = NewRuntime(context.Background(), w.sys, s, RuntimeOptions{})
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

// BenchmarkPipelineDrain: pre-appended events, 16 buckets, two workers,
// a no-op handler; beside the store's read-only 16-bucket drain of the same
// rows in the same run.
func BenchmarkPipelineDrain(b *testing.B) {
	ctx := context.Background()
	n := benchEvents()
	store, schema := newTestStore(b)
	seedBench(b, store, n)
	require.NoError(b, store.EnsureConsumerGroupIndex(ctx, 16))

	// The store alone: 16 readers read their buckets in parallel, on a new
	// pool, as each worker's is: both drains start on cold connections.
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
	storeTime := time.Since(start)
	require.Equal(b, int64(n), read.Load())

	storeRate := float64(n) / storeTime.Seconds()
	b.ReportMetric(storeRate, "store-events/s")
	b.Logf("store's read-only 16-bucket drain of %d events, pages of %d: %.0f events/s (%v)", n, benchPage(), storeRate, storeTime)
	for _, c := range benchDrains() {
		var handled atomic.Int64
		o := GroupOptions{Subscription: "drain-" + c.name, Category: "bench", Buckets: 16,
			Handler: counting(&handled), Lease: fastLease(), MaxInFlight: c.inFlight, CheckpointEvery: 1000, BatchSize: benchPage()}
		if c.batch > 0 {
			o.Handler, o.Batch.MaxEvents = countingBatches(&handled), c.batch
		}
		// Both workers start at once, as a pool would: each joins the
		// worker row before its first pass, so each claims its share at
		// once instead of one taking all and handing half over.
		a, bw := benchRuntime(b, schema, "a"), benchRuntime(b, schema, "b")
		start = time.Now()
		var starting sync.WaitGroup
		errs := make([]error, 2)
		for i, w := range []*testWorker{a, bw} {
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
		pipeRate := float64(n) / pipeTime.Seconds()
		b.ReportMetric(pipeRate, "events/s-"+c.name)
		b.ReportMetric(100*pipeRate/storeRate, "%-of-store-"+c.name)
		b.Logf("pipeline drain, 16 buckets, 2 workers, no-op handler, %s: %.0f events/s (%v): %.0f%% of the store's drain",
			c, pipeRate, pipeTime, 100*pipeRate/storeRate)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = a.rt.Stop(ctx)
		_ = bw.rt.Stop(ctx)
		cancel()
	}
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
	w := benchWorker(b, schema, "a", GroupOptions{Subscription: "live", Category: "live", Buckets: 8, Handler: handler, Lease: fastLease()})
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
			lease := LeaseOptions{Kind: kind, TTL: 3 * time.Second, Heartbeat: 500 * time.Millisecond, Margin: time.Second}
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
	batch    int // Batch.MaxEvents; 0: one event per delivery
}

func (c benchDrain) String() string {
	if c.batch > 0 {
		return fmt.Sprintf("batches of up to %d events", c.batch)
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
	batch := 500
	if n, err := strconv.Atoi(os.Getenv("KUMI_BENCH_BATCH")); err == nil && n >= 0 {
		batch = n
	}
	if batch > 0 {
		out = append(out, benchDrain{name: fmt.Sprintf("batch-%d", batch), inFlight: 1, batch: batch})
	}
	return out
}

// countingBatches is counting for batched deliveries.
func countingBatches(n *atomic.Int64) *actor.Props {
	return BatchFunc(func(_ context.Context, b *Batch) error {
		n.Add(int64(len(b.Events)))
		return nil
	})
}
