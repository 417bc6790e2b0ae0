package actors

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// procStatusKB returns a /proc/self/status field in KiB (VmRSS, VmHWM).
func procStatusKB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkLargeEventsOverload: 64 KiB events appended while every handler
// is stuck, then drained, with the default options; reports the process's
// peak RSS over its RSS before the burst. KUMI_BENCH_LARGE_EVENTS sets the
// burst (default 4,000 events, 250 MiB).
func BenchmarkLargeEventsOverload(b *testing.B) {
	ctx := context.Background()
	n := 4000
	if v, err := strconv.Atoi(os.Getenv("KUMI_BENCH_LARGE_EVENTS")); err == nil && v > 0 {
		n = v
	}
	const size, buckets, perAppend = 64 << 10, 4, 16
	store, schema := newTestStore(b)
	gate := make(chan struct{})
	var handled atomic.Int64
	handler := actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*Delivery); ok {
			<-gate // stuck until the whole burst is in
			handled.Add(1)
			ctx.Respond(Ack{})
		}
	})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	b.Cleanup(open)
	w := benchWorker(b, schema, "a", GroupOptions{Subscription: "large", Category: "large", Buckets: buckets,
		Handler: handler, Lease: benchLease(), HandlerTimeout: 10 * time.Minute})
	pgtest.Eventually(b, time.Minute, func() bool { return len(w.owned()) == buckets }, "owns every bucket")

	runtime.GC()
	debug.FreeOSMemory()
	base := procStatusKB("VmRSS")
	var peakRSS, peakHeap atomic.Int64
	stop := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			peakRSS.Store(max(peakRSS.Load(), procStatusKB("VmRSS")))
			runtime.ReadMemStats(&ms)
			peakHeap.Store(max(peakHeap.Load(), int64(ms.HeapInuse)))
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()

	payload := []byte(fmt.Sprintf(`{"p":%q}`, strings.Repeat("x", size-8)))
	start := time.Now()
	for i := 0; i < n; i += perAppend {
		batch := make([]eventsource.EventData, min(perAppend, n-i))
		for j := range batch {
			batch[j] = eventsource.EventData{Type: "Large", Data: payload}
		}
		_, err := store.Append(ctx, fmt.Sprintf("large-%d", i%64), eventsource.Any, batch)
		require.NoError(b, err)
	}
	appendTime := time.Since(start)
	head, err := store.HeadPosition(ctx)
	require.NoError(b, err)
	pgtest.Eventually(b, time.Minute, func() bool {
		pos, err := w.sys.Root.RequestFuture(w.rt.publisher, &publisherPosition{}, time.Second).Result()
		return err == nil && pos.(int64) >= head
	}, "the publisher has posted the whole burst")
	open()
	pgtest.Eventually(b, 10*time.Minute, func() bool { return handled.Load() >= int64(n) }, "drained")
	total := time.Since(start)
	close(stop)
	sampling.Wait()

	var pauses, dropped uint64
	w.group.g.mu.Lock()
	for _, q := range w.group.g.queues {
		st := q.Stats()
		pauses, dropped = pauses+st.Pauses, dropped+st.Dropped
	}
	w.group.g.mu.Unlock()
	growth := float64(peakRSS.Load()-base) / 1024
	b.ReportMetric(float64(peakRSS.Load())/1024, "peak-RSS-MB")
	b.ReportMetric(growth, "RSS-growth-MB")
	b.ReportMetric(float64(peakHeap.Load())/(1<<20), "peak-heap-MB")
	b.Logf("%d events of %d KiB (%d MiB) appended in %v while %d buckets' handlers were stuck, then drained (%v in all): "+
		"RSS %.0f MB before, peak %.0f MB (+%.0f MB), peak Go heap in use %.0f MB; %d pauses, %d batches dropped and re-read",
		n, size>>10, n*size>>20, appendTime.Round(time.Millisecond), buckets, total.Round(time.Millisecond),
		float64(base)/1024, float64(peakRSS.Load())/1024, growth, float64(peakHeap.Load())/(1<<20), pauses, dropped)
}
