package integration

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestScale: 32 workers on N=1024 buckets, then a 33rd joins. The
// development and CI machines have 2 cores, so the workers are goroutines
// in this one process, each with a pool, an actor system, a runtime and a
// group of its own — everything a worker process has but the process;
// they share nothing but the database. Reported: the time to a fair split
// from a cold start and after the join, and the lease tables' load per
// second in the steady state (pg_stat_user_tables deltas).
func TestScale(t *testing.T) {
	const workers, buckets = 32, 1024
	lease := pick(
		leaseTimings{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 3 * time.Second},
		leaseTimings{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 3 * time.Second},
	)
	url := pgtest.URL(t)
	schema := pgtest.NewSchema(t)
	cfg := clusterConfig{URL: url, Schema: schema, Subscription: subscriptionName, Category: categoryName,
		Buckets: buckets, Kind: leasestore.KindRow, Lease: lease}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prep := pgtest.NewPool(t, 4)
	if err := prepareSchema(ctx, prep, schema); err != nil {
		t.Fatal(err)
	}
	o := newObserver(t, url, schema, cfg.Subscription, cfg.Category, buckets, 100*time.Millisecond)
	e := &env{t: t, url: url, cfg: cfg, o: o}

	var mu sync.Mutex
	var ids []string
	live := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), ids...) }
	var gws []*goWorker
	defer func() {
		var wg sync.WaitGroup
		for _, w := range gws {
			wg.Add(1)
			go func() { defer wg.Done(); w.stop(t) }()
		}
		wg.Wait()
	}()

	cold := time.Now()
	var wg sync.WaitGroup
	started := make([]*goWorker, workers)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started[i] = startGoWorker(t, cfg, fmt.Sprintf("g%02d", i+1))
		}()
	}
	wg.Wait()
	for _, w := range started {
		if w == nil {
			t.FailNow()
		}
		gws = append(gws, w)
		ids = append(ids, w.id)
	}
	startup := time.Since(cold)
	at, ok := o.waitFairSplit(live, 3*time.Minute)
	if !ok {
		t.Fatalf("no fair split of %d buckets over %d workers: %s; %s", buckets, workers, o.ownedSummary(), o.workersSummary())
	}
	coldSplit := at.Sub(cold)

	e.startLoad(pick(100, 200), 1000)
	// Steady state: the lease tables' load over a window.
	window := pick(5*time.Second, 30*time.Second)
	before := leaseTableStats(ctx, t, prep, schema)
	time.Sleep(window)
	after := leaseTableStats(ctx, t, prep, schema)
	load := after.sub(before).per(window)

	joinStart := time.Now()
	j := startGoWorker(t, cfg, "g33")
	gws = append(gws, j)
	mu.Lock()
	ids = append(ids, j.id)
	mu.Unlock()
	at, ok = o.waitFairSplit(live, 3*time.Minute)
	if !ok {
		t.Fatalf("no fair split after a 33rd worker joined: %s", o.ownedSummary())
	}
	e.joins = append(e.joins, at.Sub(joinStart))
	time.Sleep(pick(time.Second, 5*time.Second))

	r := e.finish("scale", func(r *report) {
		r.extra = append(r.extra, fmt.Sprintf(
			"workers=%d(goroutines,%d cores) buckets=%d heartbeat=%v startup=%s cold_fair_split=%s "+
				"lease_rows_updated/s=%.0f lease_rows_inserted+deleted/s=%.1f lease_scans/s=%.0f window=%v",
			workers, runtime.NumCPU(), buckets, lease.Heartbeat, round(startup), round(coldSplit),
			load.updated, load.insDel, load.scans, window))
	})
	requireSafe(t, r)
}

// goWorker is a worker without a process of its own.
type goWorker struct {
	id    string
	pool  *pgxpool.Pool
	rt    *actors.Runtime
	group *actors.Group
}

func startGoWorker(t *testing.T, cfg clusterConfig, id string) *goWorker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		t.Error(err)
		return nil
	}
	pcfg.MaxConns = 4
	pcfg.ConnConfig.RuntimeParams["application_name"] = id
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Error(err)
		return nil
	}
	store, err := eventsource.New(pool, eventsource.Config{Schema: cfg.Schema})
	if err != nil {
		pool.Close()
		t.Error(err)
		return nil
	}
	logger := slog.New(slog.DiscardHandler)
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	rt, err := actors.New(system, store, actors.RuntimeOptions{})
	if err == nil {
		err = rt.Start(ctx)
	}
	if err != nil {
		pool.Close()
		t.Error(err)
		return nil
	}
	group, err := rt.StartGroup(ctx, actors.GroupOptions{
		Subscription: cfg.Subscription, Category: cfg.Category, Buckets: cfg.Buckets, Worker: id,
		Handler: sinkProps(store, cfg.Schema),
		Lease:   leasestore.LeaseOptions{Kind: cfg.Kind, TTL: cfg.Lease.TTL, Heartbeat: cfg.Lease.Heartbeat, Margin: cfg.Lease.Margin},
	})
	if err != nil {
		_ = rt.Stop(context.Background())
		pool.Close()
		t.Error(err)
		return nil
	}
	return &goWorker{id: id, pool: pool, rt: rt, group: group}
}

func (w *goWorker) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.rt.Stop(ctx); err != nil {
		t.Errorf("stop %s: %v", w.id, err)
	}
	w.pool.Close()
}

// sinkProps is internal/worker's sink handler in miniature: record the
// delivery, counting duplicates.
func sinkProps(store *eventsource.Store, schema string) *actor.Props {
	upsert := `INSERT INTO ` + pgx.Identifier{schema}.Sanitize() + `.sink AS s
		(subscription, event_id, position, stream, version, worker) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (subscription, event_id) DO UPDATE SET deliveries = s.deliveries + 1`
	return actor.PropsFromFunc(func(c actor.Context) {
		d, ok := c.Message().(*actors.Delivery)
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(d.Context, 10*time.Second)
		defer cancel()
		e := d.Event
		if _, err := store.Pool().Exec(ctx, upsert, d.Subscription, e.ID, e.Position, e.Stream, e.Version, "in-process"); err != nil {
			c.Respond(actors.Retry{Reason: err.Error()})
			return
		}
		c.Respond(actors.Ack{})
	})
}

// tableStats are cumulative counters of the lease tables.
type tableStats struct{ updated, insDel, scans float64 }

func (a tableStats) sub(b tableStats) tableStats {
	return tableStats{a.updated - b.updated, a.insDel - b.insDel, a.scans - b.scans}
}

func (a tableStats) per(d time.Duration) tableStats {
	s := d.Seconds()
	return tableStats{a.updated / s, a.insDel / s, a.scans / s}
}

func leaseTableStats(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema string) tableStats {
	t.Helper()
	var s tableStats
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0)::float8, coalesce(sum(n_tup_ins + n_tup_del), 0)::float8,
		coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)::float8
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname IN ('lease_buckets', 'lease_workers')`, schema).
		Scan(&s.updated, &s.insDel, &s.scans)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
