package actors

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// latencyAppenderEnv, set in a process's environment, makes this test
// binary the appender process of BenchmarkLiveLatencyRemote instead of
// running tests (see TestMain): "schema rate seconds".
const latencyAppenderEnv = "KUMI_LATENCY_APPENDER"

// latencyEnv reads a positive integer from the environment, or def.
func latencyEnv(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkLiveLatencyRemote: append → handler start with the appender in
// another process, at KUMI_LATENCY_RATE events/s (default 5,000), in
// appends of KUMI_LATENCY_BATCH events (default 1) over 500 streams, for
// KUMI_LATENCY_SECONDS (default 10). The appender is this test binary run again as a child process; it
// runs a Sequencer, as every process that appends should, and its appends
// wake it. Here one worker, 8 buckets, records for each event the time
// from just before its Append (the event's data, a clock of the same
// machine) to the handler receiving it. Prints p50, p99 and max, and the
// rate the child reached.
//
//	go test -run '^$' -bench BenchmarkLiveLatencyRemote -benchtime 1x ./actors/
func BenchmarkLiveLatencyRemote(b *testing.B) {
	rate, seconds := latencyEnv("KUMI_LATENCY_RATE", 5000), latencyEnv("KUMI_LATENCY_SECONDS", 10)
	batch := latencyEnv("KUMI_LATENCY_BATCH", 1)
	_, schema := newTestStore(b)
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

	for range b.N {
		mu.Lock()
		lat = lat[:0]
		mu.Unlock()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+pgtest.URL(b),
			fmt.Sprintf("%s=%s %d %d %d", latencyAppenderEnv, schema, rate, seconds, batch))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(b, cmd.Run(), "appender process: %s", out.String())
		var appended int
		var reached float64
		child := strings.TrimSpace(out.String())
		_, err := fmt.Sscanf(child, "appended %d at %f", &appended, &reached)
		require.NoError(b, err, "appender process: %s", child)
		pgtest.Eventually(b, time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return len(lat) >= appended }, "all handled")

		mu.Lock()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		p50, p99, pmax := lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
		mu.Unlock()
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		b.ReportMetric(reached, "events/s")
		var load string
		if l, err := os.ReadFile("/proc/loadavg"); err == nil {
			load = strings.Join(strings.Fields(string(l))[:3], " ")
		}
		b.Logf("live latency append→handler, appender in another process at %d events/s in appends of %d for %ds: "+
			"p50 %v, p99 %v, max %v; the appender: %s; load average %s",
			rate, batch, seconds, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), pmax.Round(time.Millisecond), child, load)
	}
}

// runLatencyAppender is the appender process of BenchmarkLiveLatencyRemote:
// spec is "schema rate seconds batch". It appends rate events a second in
// appends of batch events (each in a goroutine of its own, paced by the clock, not by the
// appends: a slow append delays nothing after it) for the given seconds,
// with its own Sequencer, waits until every event has a position, and
// prints "appended N at R, append p50 … p99 …" (R: events/s reached; the
// percentiles of the appends' own time). It returns the exit code.
func runLatencyAppender(spec string) int {
	var schema string
	var rate, seconds, batch int
	if _, err := fmt.Sscanf(spec, "%s %d %d %d", &schema, &rate, &seconds, &batch); err != nil {
		fmt.Fprintln(os.Stderr, "appender:", err)
		return 2
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "appender:", err)
		return 2
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "appender:", err)
		return 2
	}
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	if err != nil {
		fmt.Fprintln(os.Stderr, "appender:", err)
		return 2
	}
	seq := eventsource.NewSequencer(store, eventsource.SequencerOptions{})
	if err := seq.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "appender:", err)
		return 2
	}
	defer func() { _ = seq.Stop(context.Background()) }()
	head0, err := store.HeadPosition(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "appender:", err)
		return 1
	}

	var wg sync.WaitGroup
	var failed atomic.Value
	appends := rate * seconds / batch
	total := appends * batch
	took := make([]time.Duration, appends) // each append's own time
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	for sent := 0; sent < appends; {
		<-tick.C
		due := min(appends, int(time.Since(start).Seconds()*float64(rate)/float64(batch)))
		for ; sent < due; sent++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				at := time.Now()
				events := make([]eventsource.EventData, batch)
				for k := range events {
					events[k] = eventsource.EventData{Type: "Tick", Data: []byte(strconv.FormatInt(at.UnixNano(), 10))}
				}
				_, err := store.Append(ctx, fmt.Sprintf("live-%d", i%500), eventsource.Any, events)
				took[i] = time.Since(at)
				if err != nil {
					failed.Store(err)
				}
			}(sent)
		}
	}
	tick.Stop()
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		fmt.Fprintln(os.Stderr, "appender:", err)
		return 1
	}
	if !pgtest.WaitFor(time.Minute, func() bool {
		h, err := store.HeadPosition(ctx)
		return err == nil && h >= head0+int64(total)
	}) {
		fmt.Fprintln(os.Stderr, "appender: not every event sequenced within a minute")
		return 1
	}
	slices.Sort(took)
	fmt.Printf("appended %d at %.0f, append p50 %v p99 %v\n", total, float64(total)/elapsed.Seconds(),
		took[appends/2].Round(10*time.Microsecond), took[appends*99/100].Round(10*time.Microsecond))
	return 0
}
