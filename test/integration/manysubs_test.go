package integration

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestManySubscriptionsOnADefaultServer: 4 worker processes × 50
// subscriptions of 16 buckets (one runtime each, every subscription a
// group of it) on a server started with PostgreSQL's default
// max_connections of 100, and a burst of appends: every event reaches
// the sink once per subscription, and no worker was refused a connection.
// Each worker holds its store pool, its lease pool, its sequencer's and its
// notifier's connections whatever its number of subscriptions (before the
// process's one lease pool, each group had a pool of its own: 4 × 50 × 2
// more than the server allows). Row leases here;
// TestManySessionSubscriptionsOnADefaultServer runs the same with
// session-kind ones.
func TestManySubscriptionsOnADefaultServer(t *testing.T) { manySubscriptions(t, leasestore.KindRow) }

// manySubsStall is how long a manySubscriptions scenario's deliveries may
// make no progress.
const manySubsStall = 5 * time.Minute

// manySubscriptions runs the scenario of
// TestManySubscriptionsOnADefaultServer with leases of kind.
func manySubscriptions(t *testing.T, kind leasestore.Kind) {
	const workers, subscriptions, buckets = 4, 50, 16
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.Options{MaxConnections: 100})
	if err != nil {
		t.Fatalf("start a server of our own: %v", err)
	}
	t.Cleanup(srv.Stop)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", srv.Port())
	const schema = "kumi_many"
	pool, err := pgxpool.New(ctx, withAppName(url+"&pool_max_conns=2", "harness"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := prepareSchema(ctx, pool, schema); err != nil {
		t.Fatalf("prepare schema: %v", err)
	}
	cfg := clusterConfig{URL: url, Schema: schema, Subscription: "many", Category: categoryName, Buckets: buckets,
		Kind: kind, PoolConns: 8,
		// The leasestore's proportions at a fifth of its defaults: 50
		// groups a worker renew every second, not every 300 ms.
		Lease: leaseTimings{TTL: 6 * time.Second, Heartbeat: time.Second, Margin: 2 * time.Second},
		Extra: []string{"-subscriptions", fmt.Sprint(subscriptions)}}
	c := newCluster(t, cfg)
	begun := time.Now()
	for i := range workers {
		c.start(fmt.Sprintf("w%d", i+1), startOpts{})
	}

	// The peak of the server's connections, sampled while the scenario runs.
	var peak atomic.Int64
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			var n int64
			if err := pool.QueryRow(sampleCtx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&n); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-sampleCtx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	defer func() { stopSampling(); <-sampled }()

	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	seq := eventsource.NewSequencer(store, eventsource.SequencerOptions{})
	if err := seq.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = seq.Stop(context.Background()) })
	events := pick(200, 1000)
	for n := range events {
		actx, acancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := store.Append(actx, fmt.Sprintf("%s-%d", categoryName, n%64), eventsource.Any,
			[]eventsource.EventData{{ID: uuid.New(), Type: "Ticked", Data: []byte(`{}`)}})
		acancel()
		if err != nil {
			t.Fatalf("append %d: %v", n, err)
		}
	}

	appended := time.Since(begun)

	// Every (subscription, event) in the sink: a progress-based wait, so a
	// loaded machine may take as long as it needs while the count grows.
	want := int64(events * subscriptions)
	q := pgx.Identifier{schema}.Sanitize()
	var sunk int64
	lastProgress, best := time.Now(), int64(-1)
	for {
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		err := pool.QueryRow(qctx, `SELECT count(*) FROM `+q+`.sink`).Scan(&sunk)
		qcancel()
		if err == nil && sunk >= want {
			break
		}
		if err == nil && sunk > best {
			best, lastProgress = sunk, time.Now()
		}
		// No progress for manySubsStall fails: 200 groups start before the
		// first delivery, which under -race beside other packages takes
		// minutes; a lost event stops the count for good.
		if time.Since(lastProgress) > manySubsStall || ctx.Err() != nil {
			c.checkProcesses()
			t.Fatalf("%d of %d deliveries after no progress for %v (last error %v); peak %d connections", sunk, want, manySubsStall, err, peak.Load())
		}
		time.Sleep(200 * time.Millisecond)
	}
	delivered := time.Since(begun)
	// Every worker has started all its groups (it logs "worker started"
	// then) before the connections are counted and the workers stopped:
	// the others may deliver everything while one is still starting its
	// last groups (one at a time), and a stop then interrupts its start.
	startedAll := time.Now()
	for _, p := range c.all {
		for grepFile(p.logPath, "worker started") == "" {
			if time.Since(startedAll) > manySubsStall {
				c.checkProcesses()
				t.Fatalf("%s did not start all its %d groups within %v of the last delivery", p.id, subscriptions, manySubsStall)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	allStarted := time.Since(begun)
	var missing, subs int64
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM `+q+`.events e WHERE e.category = $1 AND
			(SELECT count(DISTINCT s.subscription) FROM `+q+`.sink s WHERE s.event_id = e.event_id) <> $2),
		(SELECT count(DISTINCT subscription) FROM `+q+`.sink)`, categoryName, subscriptions).Scan(&missing, &subs); err != nil {
		t.Fatal(err)
	}
	var conns int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'w%'`).Scan(&conns); err != nil {
		t.Fatal(err)
	}
	stopping := time.Now()
	c.stopAll()
	stopped := time.Since(stopping)
	c.checkProcesses()
	for _, p := range c.all {
		if line := grepFile(p.logPath, "too many clients"); line != "" {
			t.Errorf("%s was refused a connection: %s", p.id, line)
		}
	}
	if missing != 0 || subs != subscriptions {
		t.Errorf("%d events not delivered to every one of the %d subscriptions (%d subscriptions in the sink)", missing, subscriptions, subs)
	}
	t.Logf("many subscriptions (%s form, %v leases): %d workers × %d subscriptions × %d buckets, %d events: %d deliveries; "+
		"%d worker connections at the end (%.1f per worker), peak %d client connections of max_connections 100; "+
		"appended %v after the start, all delivered %v after it, every worker's groups started %v after it, the workers stopped in %v",
		form(), kind, workers, subscriptions, buckets, events, sunk, conns, float64(conns)/workers, peak.Load(),
		appended.Round(time.Millisecond), delivered.Round(time.Millisecond), allStarted.Round(time.Millisecond), stopped.Round(time.Millisecond))
}
