package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// env is one scenario's world: a fresh schema with the observer's logs, a
// cluster of worker processes, an observer and, once started, a steady load
// of appends.
type env struct {
	t     *testing.T
	url   string
	cfg   clusterConfig
	c     *cluster
	o     *observer
	load  *load
	start time.Time

	faults []fault
	joins  []time.Duration
	// failoverTimes are measured by the scenario itself (a database
	// restart has no one worker to fail over from).
	failoverTimes []time.Duration
}

const (
	subscriptionName = "chaos"
	categoryName     = "acct"
)

func newEnv(t *testing.T, url string, cfg clusterConfig) *env {
	t.Helper()
	cfg.URL = url
	cfg.Schema = pgtest.NewSchema(t)
	cfg.Subscription, cfg.Category = subscriptionName, categoryName
	if cfg.Lease == (leaseTimings{}) {
		cfg.Lease = defaultLease()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("env: %v", err)
	}
	defer pool.Close()
	if err := prepareSchema(ctx, pool, cfg.Schema); err != nil {
		t.Fatalf("env: prepare schema: %v", err)
	}
	e := &env{t: t, url: url, cfg: cfg, start: time.Now()}
	e.o = newObserver(t, url, cfg.Schema, cfg.Subscription, cfg.Category, cfg.Buckets, 20*time.Millisecond)
	e.c = newCluster(t, cfg)
	e.o.logOf = e.c.logOf
	e.o.claimStale = 2 * cfg.Lease.TTL // leasestore's claim stale-after
	e.o.statusOf = func(worker string, slot int) string {
		if p := e.c.byID(worker); p != nil {
			return slotStatus(p, slot)
		}
		return "no running process of that id"
	}
	return e
}

// startWorkers starts slots w1..wk and waits for their fair split.
func (e *env) startWorkers(k int, o startOpts) []string {
	e.t.Helper()
	slots := make([]string, k)
	for i := range slots {
		slots[i] = fmt.Sprintf("w%d", i+1)
		e.c.start(slots[i], o)
	}
	if _, ok := e.o.waitFairSplit(e.c.live, 90*time.Second); !ok {
		e.t.Fatalf("no fair split of %d buckets over %v: %s", e.cfg.Buckets, e.c.live(), e.o.ownedSummary())
	}
	return slots
}

// join starts a new incarnation of slot and records how long it took the
// group to split fairly with it; it fails the test if that never happens.
func (e *env) join(slot string, o startOpts) *proc {
	e.t.Helper()
	p := e.c.start(slot, o)
	at, ok := e.o.waitFairSplit(e.c.live, 60*time.Second)
	if !ok {
		e.t.Errorf("no fair split after %s joined: %s", p.id, e.o.ownedSummary())
		return p
	}
	e.joins = append(e.joins, at.Sub(p.started))
	return p
}

// finish stops the load, waits for every event to reach the sink, reads
// the report, prints its summary line, stops the workers gracefully and
// checks their processes and logs.
func (e *env) finish(scenario string, also ...func(*report)) report {
	e.t.Helper()
	if e.load != nil {
		e.load.stop()
	}
	settled := e.o.settle(pick(60*time.Second, 180*time.Second))
	r := e.o.collect(scenario, e.cfg.Kind.String(), e.faults)
	r.convergences = e.joins
	r.failovers = append(r.failovers, e.failoverTimes...)
	if e.load != nil {
		r.extra = append(r.extra, fmt.Sprintf("append_errors=%d", e.load.failed.Load()))
	}
	for _, f := range also {
		f(&r)
	}
	fmt.Println(r.line())
	if !settled {
		e.t.Errorf("%d events never reached the sink; workers own: %s%s", r.lost, e.o.ownedSummary(), e.o.lostStory())
	}
	if e.c != nil {
		e.c.stopAll()
		e.c.checkProcesses()
	}
	return r
}

// requireSafe asserts the invariants every scenario keeps: nothing lost,
// no checkpoint moved back, none moved over an event not yet handled, no
// lease taken while valid, first deliveries in stream order, and at most
// one stale delivery per worker and bucket (the one in flight when it
// lost the bucket).
func requireSafe(t *testing.T, r report) {
	t.Helper()
	if r.appended == 0 || r.handled == 0 {
		t.Errorf("%s: nothing appended or handled (%d, %d)", r.scenario, r.appended, r.handled)
	}
	if r.lost != 0 {
		t.Errorf("%s: %d events lost", r.scenario, r.lost)
	}
	if r.regressions != 0 {
		t.Errorf("%s: %d checkpoint regressions", r.scenario, r.regressions)
	}
	if r.overlaps != 0 {
		t.Errorf("%s: %d leases taken while still valid without evidence", r.scenario, r.overlaps)
	}
	if r.staleCheckpoints != 0 {
		t.Errorf("%s: %d checkpoint writes landed from a worker that did not own the bucket", r.scenario, r.staleCheckpoints)
	}
	if r.order != 0 {
		t.Errorf("%s: %d first deliveries out of stream order", r.scenario, r.order)
	}
	if r.skippedWrites != 0 {
		t.Errorf("%s: %d checkpoint writes moved over an event not yet handled (a skip: a loss, or a near miss if it "+
			"was delivered later)%s", r.scenario, r.skippedWrites, r.skippedStory)
	}
	for k, n := range r.staleByOwner {
		if n > 1 {
			t.Errorf("%s: %d deliveries by %s after it lost the bucket", r.scenario, n, k)
		}
	}
}

// load appends a steady stream of events to random streams of the
// category, from goroutines with a pool and a sequencer of their own (a
// process that appends runs a sequencer). Errors (a restarting server,
// say) are counted and the appender goes on.
type load struct {
	pool   *pgxpool.Pool
	seq    *eventsource.Sequencer
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	ok     atomic.Int64
	failed atomic.Int64
}

// startLoad appends about rate events per second over streams streams.
func (e *env) startLoad(rate, streams int) {
	e.t.Helper()
	pool, err := pgxpool.New(context.Background(), withAppName(e.url, "appender"))
	if err != nil {
		e.t.Fatalf("load: %v", err)
	}
	store, err := eventsource.New(pool, eventsource.Config{Schema: e.cfg.Schema})
	if err != nil {
		e.t.Fatalf("load: %v", err)
	}
	l := &load{pool: pool, seq: eventsource.NewSequencer(store, eventsource.SequencerOptions{})}
	if err := l.seq.Start(context.Background()); err != nil {
		e.t.Fatalf("load: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	const appenders = 2
	every := time.Duration(int64(appenders) * int64(time.Second) / int64(rate))
	for a := range appenders {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(a), uint64(time.Now().UnixNano())))
			tick := time.NewTicker(every)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				stream := fmt.Sprintf("%s-%d", e.cfg.Category, rng.IntN(streams))
				data, _ := json.Marshal(map[string]int{"appender": a, "n": n})
				actx, acancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := store.Append(actx, stream, eventsource.Any, []eventsource.EventData{{Type: "Ticked", Data: data}})
				acancel()
				if err != nil {
					l.failed.Add(1)
				} else {
					l.ok.Add(1)
				}
			}
		}()
	}
	e.load = l
	e.t.Cleanup(l.stop)
}

func (l *load) stop() {
	l.once.Do(func() {
		l.cancel()
		l.wg.Wait()
		_ = l.seq.Stop(context.Background())
		l.pool.Close()
	})
}

// sleepUntil sleeps until t.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }
