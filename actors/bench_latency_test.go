package actors

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
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
// machine) to the handler receiving it. Prints p50, p99 and max, the rate
// the child reached, the same split by stage (see latencyTrace.stages), and
// in which seconds of the run the slowest 1% began.
//
//	go test -run '^$' -bench BenchmarkLiveLatencyRemote -benchtime 1x ./actors/
func BenchmarkLiveLatencyRemote(b *testing.B) {
	rate, seconds := latencyEnv("KUMI_LATENCY_RATE", 5000), latencyEnv("KUMI_LATENCY_SECONDS", 10)
	batch := latencyEnv("KUMI_LATENCY_BATCH", 1)
	_, schema := newTestStore(b)
	tr := &latencyTrace{}
	handler := actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			if ns, err := strconv.ParseInt(string(d.Event.Data), 10, 64); err == nil {
				tr.handled(d.Event.Position, time.Unix(0, ns), time.Now())
			}
			ctx.Respond(Ack{})
		}
	})
	w := latencyWorker(b, schema, tr, GroupOptions{Subscription: "live", Category: "live", Buckets: 8, Handler: handler, Lease: benchLease()})
	pgtest.Eventually(b, time.Minute, func() bool { return len(w.owned()) == 8 }, "owns every bucket")

	commits := filepath.Join(b.TempDir(), "commits")
	for range b.N {
		tr.reset()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+pgtest.URL(b),
			fmt.Sprintf("%s=%s %d %d %d %s", latencyAppenderEnv, schema, rate, seconds, batch, commits))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(b, cmd.Run(), "appender process: %s", out.String())
		var appended int
		var reached float64
		child := strings.TrimSpace(out.String())
		_, err := fmt.Sscanf(child, "appended %d at %f", &appended, &reached)
		require.NoError(b, err, "appender process: %s", child)
		pgtest.Eventually(b, time.Minute, func() bool { return tr.count() >= appended }, "all handled")
		returned, err := readCommits(commits)
		require.NoError(b, err)
		committed, err := commitTimes(w.pool, schema)
		require.NoError(b, err)
		stages, when := tr.stages(returned, committed)
		lat := stages[len(stages)-1].d
		p50, p99, pmax := lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
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
		// One log line: a benchmark's log is cut after ten lines.
		b.Logf("the slowest 1%% began their appends in the run's seconds 0, 1, …: %v\n%s", when, formatStages(stages))
	}
}

// runLatencyAppender is the appender process of BenchmarkLiveLatencyRemote:
// spec is "schema rate seconds batch commits". It appends rate events a
// second in appends of batch events (each in a goroutine of its own, paced
// by the clock, not by the appends: a slow append delays nothing after it)
// for the given seconds, with its own Sequencer and its pool warmed first
// (see warmPool), waits until every event
// has a position, writes to the file commits a line "at committed" (Unix
// nanoseconds) per append, and prints "appended N at R, append p50 … p99 …"
// (R: events/s reached; the percentiles of the appends' own time). It
// returns the exit code.
func runLatencyAppender(spec string) int {
	var schema, commits string
	var rate, seconds, batch int
	if _, err := fmt.Sscanf(spec, "%s %d %d %d %s", &schema, &rate, &seconds, &batch, &commits); err != nil {
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
	if err := warmPool(ctx, pool, store); err != nil {
		fmt.Fprintln(os.Stderr, "appender: warming the pool:", err)
		return 1
	}

	var wg sync.WaitGroup
	var failed atomic.Value
	appends := rate * seconds / batch
	total := appends * batch
	began, ended := make([]time.Time, appends), make([]time.Time, appends)
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
				began[i], ended[i] = at, time.Now()
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
	var lines bytes.Buffer
	took := make([]time.Duration, appends)
	for i := range appends {
		fmt.Fprintf(&lines, "%d %d\n", began[i].UnixNano(), ended[i].UnixNano())
		took[i] = ended[i].Sub(began[i])
	}
	if err := os.WriteFile(commits, lines.Bytes(), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "appender:", err)
		return 1
	}
	slices.Sort(took)
	fmt.Printf("appended %d at %.0f, append p50 %v p99 %v\n", total, float64(total)/elapsed.Seconds(),
		took[appends/2].Round(10*time.Microsecond), took[appends*99/100].Round(10*time.Microsecond))
	return 0
}

// warmPool makes every connection of the appender's pool and prepares the
// append statement on each (an append in a transaction rolled back),
// before the clock starts: a new connection (a server process started) or
// a statement's first preparation would otherwise fall on the first
// appends, and into the percentiles of a steady rate.
func warmPool(ctx context.Context, pool *pgxpool.Pool, store *eventsource.Store) error {
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		_, err = store.AppendTx(ctx, tx, "warm-0", eventsource.Any, []eventsource.EventData{{Type: "Warm", Data: []byte("0")}})
		if rerr := tx.Rollback(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readCommits reads the appender's commits file: the time each Append
// returned, by the time it began (the events' data).
func readCommits(path string) (map[int64]time.Time, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[int64]time.Time{}
	for line := range strings.Lines(string(data)) {
		var at, done int64
		if _, err := fmt.Sscanf(line, "%d %d", &at, &done); err != nil {
			return nil, fmt.Errorf("commits file: %q: %w", line, err)
		}
		out[at] = time.Unix(0, done)
	}
	return out, nil
}

// latencyWorker starts the benchmark's worker: a runtime whose publisher
// reads are timed, and a listener on its notifier recording each head it
// announces, into tr; then a group of opts.
func latencyWorker(b *testing.B, schema string, tr *latencyTrace, opts GroupOptions) *testWorker {
	b.Helper()
	w := &testWorker{name: "a", sys: quietSystem(), pool: pgtest.NewPool(b, 24)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(b, err)
	w.rt, err = New(w.sys, s, RuntimeOptions{})
	require.NoError(b, err)
	w.rt.reads = timedReads{PageReader: w.rt.reads, tr: tr}
	require.NoError(b, w.rt.Start(context.Background()))
	l, err := w.rt.notifier.Listen(s.NotifyChannel())
	require.NoError(b, err)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-l.C():
				tr.notified(time.Now(), l.Latest())
			}
		}
	}()
	b.Cleanup(func() {
		close(done)
		wg.Wait()
		l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = w.rt.Stop(ctx)
	})
	w.startGroup(b, opts)
	return w
}

// latencyTrace records when the events of BenchmarkLiveLatencyRemote
// reached each stage of the live path in the worker.
type latencyTrace struct {
	mu    sync.Mutex
	heads []headSeen     // the heads the notifier announced, in time order
	pages []timedRead    // the publisher's reads, in order
	done  []handledEvent // the events the handler received
}

type (
	headSeen struct {
		at   time.Time
		head int64
	}
	timedRead struct {
		start, end time.Time
		to         int64 // the last position read
	}
	handledEvent struct {
		pos         int64
		at, handled time.Time
	}
)

func (tr *latencyTrace) reset() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.heads, tr.pages, tr.done = nil, nil, nil
}

func (tr *latencyTrace) notified(at time.Time, head int64) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.heads = append(tr.heads, headSeen{at, head})
}

func (tr *latencyTrace) read(start, end time.Time, to int64) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.pages = append(tr.pages, timedRead{start, end, to})
}

func (tr *latencyTrace) handled(pos int64, at, handled time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.done = append(tr.done, handledEvent{pos, at, handled})
}

func (tr *latencyTrace) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.done)
}

// latencyStage is the time from just before each event's Append to a stage
// of its way to the handler, sorted.
type latencyStage struct {
	name string
	d    []time.Duration
	tail time.Duration // the mean over the events of the slowest 1% append→handler
}

// commitTimes returns, by the time its append began (the events' data),
// the commit time of each event's append and of the sequencer transaction
// that gave it its position (track_commit_timestamp is on in pgtest's
// server; the sequencer's update of the append's range is the range row's
// last version).
func commitTimes(pool *pgxpool.Pool, schema string) (map[int64][2]time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := pgx.Identifier{schema}.Sanitize()
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT e.data::text, pg_xact_commit_timestamp(e.xmin), pg_xact_commit_timestamp(a.xmin)
FROM %[1]s.events e JOIN %[1]s.appends a ON a.seq = e.seq`, q))
	if err != nil {
		return nil, err
	}
	out := map[int64][2]time.Time{}
	var data string
	var appended, sequenced time.Time
	_, err = pgx.ForEachRow(rows, []any{&data, &appended, &sequenced}, func() error {
		at, err := strconv.ParseInt(data, 10, 64)
		if err != nil {
			return fmt.Errorf("event data %q: %w", data, err)
		}
		out[at] = [2]time.Time{appended, sequenced}
		return nil
	})
	return out, err
}

// stages returns, for every handled event, the time from just before its
// append to: the append's commit (committed, from the server, by append
// start), Append's return in the appender (returned), the commit of its
// position, the first head announced at or past it, the start and the end
// of the publisher's read that returned it, and the handler; each sorted.
// It also returns when the slowest 1% began their appends: how many in
// each second of the run.
func (tr *latencyTrace) stages(returned map[int64]time.Time, committed map[int64][2]time.Time) ([]latencyStage, []int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	names := []string{"append committed (server's clock)", "Append returned in the appender", "position committed (server's clock)",
		"position notified to the worker", "publisher read began", "publisher read ended", "handler"}
	first := tr.done[0].at
	for _, e := range tr.done {
		if e.at.Before(first) {
			first = e.at
		}
	}
	rows := make([][]time.Duration, 0, len(tr.done))
	for _, e := range tr.done {
		// The stages, then when the append began, into the run.
		row := slices.Repeat([]time.Duration{-1}, len(names)+1)
		row[len(names)] = e.at.Sub(first)
		since := func(t time.Time) time.Duration { return t.Sub(e.at) }
		if c, ok := committed[e.at.UnixNano()]; ok {
			row[0], row[2] = since(c[0]), since(c[1])
		}
		if r, ok := returned[e.at.UnixNano()]; ok {
			row[1] = since(r)
		}
		if i := sort.Search(len(tr.heads), func(i int) bool { return tr.heads[i].head >= e.pos }); i < len(tr.heads) {
			row[3] = since(tr.heads[i].at)
		}
		if j := sort.Search(len(tr.pages), func(i int) bool { return tr.pages[i].to >= e.pos }); j < len(tr.pages) {
			row[4], row[5] = since(tr.pages[j].start), since(tr.pages[j].end)
		}
		row[6] = e.handled.Sub(e.at)
		rows = append(rows, row)
	}
	last := len(names) - 1
	slices.SortFunc(rows, func(a, b []time.Duration) int { return cmp.Compare(a[last], b[last]) })
	tail := rows[len(rows)*99/100:]
	var when []int
	for _, r := range tail {
		sec := int(r[len(names)] / time.Second)
		for len(when) <= sec {
			when = append(when, 0)
		}
		when[sec]++
	}
	out := make([]latencyStage, len(names))
	for k, name := range names {
		st := latencyStage{name: name, d: make([]time.Duration, 0, len(rows))}
		var sum time.Duration
		for _, r := range rows {
			st.d = append(st.d, r[k])
		}
		for _, r := range tail {
			sum += r[k]
		}
		st.tail = sum / time.Duration(len(tail))
		slices.Sort(st.d)
		out[k] = st
	}
	return out, when
}

// formatStages prints the stages: p50, p99, max, and the mean over the
// slowest 1% of events (which stage their time went to). -1 marks an event
// a stage did not see (a head the notifier coalesced past is not one).
func formatStages(stages []latencyStage) string {
	var b strings.Builder
	fmt.Fprintf(&b, "time from just before Append to %-22s %9s %9s %9s %16s\n", "", "p50", "p99", "max", "slowest 1% mean")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }
	for _, st := range stages {
		n := len(st.d)
		fmt.Fprintf(&b, "  %-51s %9s %9s %9s %16s\n", st.name, ms(st.d[n/2]), ms(st.d[n*99/100]), ms(st.d[n-1]), ms(st.tail))
	}
	return b.String()
}

// timedReads records the publisher's reads into tr.
type timedReads struct {
	eventsource.PageReader
	tr *latencyTrace
}

func (t timedReads) ReadAllPage(ctx context.Context, p eventsource.Page) ([]eventsource.RecordedEvent, error) {
	start := time.Now()
	events, err := t.PageReader.ReadAllPage(ctx, p)
	if n := len(events); n > 0 {
		t.tr.read(start, time.Now(), events[n-1].Position)
	}
	return events, err
}
