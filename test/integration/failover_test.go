package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
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

// TestPrimaryFailover: a primary of the scenario's own and a real
// streaming standby, replicated asynchronously; two worker processes on a
// multi-host URL (target_session_attrs=read-write) and appenders on it
// too, under a steady load. The standby is cut off under the load (so
// that it lacks the primary's last commits for sure, and the new primary
// hands their positions out again), the primary is killed (kill -9 of its
// process group) under live appends after it delivered more, and the
// standby is promoted; the workers follow it, and the appenders go on
// there. Both lease kinds; and with synchronous replication
// (synchronous_standby_names), where the standby is not cut off and no
// acknowledged append may be lost. It reports
//
//   - lost: events that exist on the new primary and never reached the
//     sink (must be 0);
//   - lost_by_database: appends acknowledged to the appenders that the new
//     primary does not have (asynchronous replication: reported, not
//     judged), of which lost_in_flight were acknowledged after the primary
//     began to fail; synchronously, none may be missing, but for
//     lost_unpromised: those acknowledged while an HA manager ran the
//     primary without its synchronous standby or switched over (see
//     TestPrimaryFailoverUnderPgAutoFailover);
//   - phantom: deliveries recorded on the new primary of events it does
//     not have (handlers may see events the database then loses: the old
//     primary's, in flight at the failover);
//   - duplicates, and resume: from the promotion to the first delivery
//     recorded on the new primary;
//   - server_changes: the workers' kumi.store.server_changes.
func TestPrimaryFailover(t *testing.T) {
	for _, c := range []struct {
		kind leasestore.Kind
		sync bool
	}{{leasestore.KindRow, false}, {leasestore.KindSession, false}, {leasestore.KindRow, true}} {
		name := c.kind.String() + "/async"
		if c.sync {
			name = c.kind.String() + "/sync"
		}
		t.Run(name, func(t *testing.T) { primaryFailover(t, c.kind, c.sync) })
	}
}

// primaryFailover is TestPrimaryFailover with one lease kind, and
// asynchronous or synchronous replication.
func primaryFailover(t *testing.T, kind leasestore.Kind, sync bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.Options{MaxConnections: 100})
	if err != nil {
		t.Fatalf("start a server of our own: %v", err)
	}
	t.Cleanup(srv.Stop)
	standby := pgtest.NewReplica(t, srv)
	c := failoverCase{kind: kind, manager: "none", replication: "async",
		url: fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			srv.Port(), standby.Port()),
		fail: func() {
			srv.Kill()
			killed := time.Now()
			if err := standby.Promote(ctx); err != nil {
				t.Fatalf("promote: %v", err)
			}
			t.Logf("primary killed; standby promoted %v later", time.Since(killed).Round(time.Millisecond))
		}}
	if sync {
		c.replication = "sync"
		c.prepare = func(pool *pgxpool.Pool) { replicateSynchronously(ctx, t, pool) }
	} else {
		c.beforeFail = func(f *failoverRun) {
			// The standby misses the primary's last commits for sure: it
			// is cut off under the load, and the old primary delivers more
			// before it dies. (Synchronously, no commit would end
			// meanwhile.)
			if err := standby.Detach(ctx); err != nil {
				t.Fatalf("detach the standby: %v", err)
			}
			cut, _ := f.sinkCounts()
			f.waitSunk(func(n int) bool { return n >= cut+pick(50, 200) }, "deliveries after the standby is cut off")
		}
	}
	runFailover(ctx, t, c)
}

// failoverCase is one form of the failover scenario: where the workers
// connect, how the primary fails and its standby takes over, and what the
// replication promises.
type failoverCase struct {
	kind        leasestore.Kind
	url         string // a multi-host URL that reaches the primary
	manager     string // the HA manager, for the SUMMARY line ("none": the test promotes)
	replication string // "async" (acknowledged appends may be lost) or "sync" (none may)
	// prepare runs on the primary before the workers start; beforeFail
	// once the load runs and deliveries flow; fail fails the primary and
	// returns once the standby is promoted.
	prepare    func(*pgxpool.Pool)
	beforeFail func(*failoverRun)
	fail       func()
	// promised, when set, is asked after the failover which
	// acknowledgements the HA manager promised to keep: those made while
	// it ran the primary with a synchronous standby. The others — while it
	// ran without one (wait_primary), or during its switchover — are
	// reported as unpromised, not judged. Unset, every acknowledgement of
	// a synchronous case is judged.
	promised func() func(ackedAt time.Time) bool
}

// runFailover runs the failover scenario: two workers and the appenders
// on c.url, the primary failed under the load, and the outcome counted on
// the new primary (see TestPrimaryFailover).
func runFailover(ctx context.Context, t *testing.T, c failoverCase) {
	const schema = "kumi_failover"
	pool, err := pgxpool.New(ctx, c.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := prepareSchema(ctx, pool, schema); err != nil {
		t.Fatalf("prepare schema: %v", err)
	}
	if c.prepare != nil {
		c.prepare(pool)
	}
	cfg := clusterConfig{URL: c.url, Schema: schema, Subscription: subscriptionName, Category: categoryName, Buckets: 8,
		Kind: c.kind, Lease: defaultLease()}
	cl := newCluster(t, cfg)
	cl.start("w1", startOpts{})
	cl.start("w2", startOpts{})
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	f := &failoverRun{t: t, pool: pool, store: store, schema: schema}

	l := startAckedLoad(t, c.url, schema, pick(100, 200))
	f.waitSunk(func(n int) bool { return n >= pick(200, 1000) }, "deliveries before the primary fails")
	if c.beforeFail != nil {
		c.beforeFail(f)
	}
	failed := time.Now()
	c.fail()
	promoted := time.Now()
	pool.Reset()
	afterPromotion := l.ok.Load()
	if !pgtest.WaitFor(2*time.Minute, func() bool { return l.ok.Load() >= afterPromotion+int64(pick(200, 1000)) }) {
		t.Fatalf("the appenders did not go on on the new primary (%d acknowledged since the promotion)", l.ok.Load()-afterPromotion)
	}
	l.stop()

	lost := f.settle()
	onPrimary, stored := f.eventIDs(), f.stored()
	unsequenced := f.unsequenced()
	// Appends acknowledged once the primary began to fail (kill -9 sent,
	// or a switchover asked) are counted apart: they were in flight.
	promised := func(time.Time) bool { return true }
	if c.promised != nil {
		promised = c.promised()
	}
	lostByDatabase, lostInFlight, lostUnpromised := 0, 0, 0
	for id, at := range l.ackedTimes() {
		if !stored[id] {
			lostByDatabase++
			if !at.Before(failed) {
				lostInFlight++
			}
			if !promised(at) {
				lostUnpromised++
			}
		}
	}
	sunk, deliveries := f.sinkCounts()
	var resume time.Duration
	var first *time.Time
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT min(first_at) FROM %s.sink WHERE first_at > $1`,
		pgx.Identifier{schema}.Sanitize()), promoted).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if first != nil {
		resume = first.Sub(promoted)
	}
	var changes float64
	for _, p := range cl.all {
		if p.running() {
			changes += scrapeMetric(p, "kumi_store_server_changes")
		}
	}
	recorded, err := store.ServerChanges(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	cl.stopAll()
	cl.checkProcesses()
	fmt.Printf("SUMMARY primary-failover form=%s manager=%s lease=%s replication=%s appended=%d append_errors=%d events=%d handled=%d "+
		"lost=%d lost_by_database=%d lost_in_flight=%d lost_unpromised=%d unsequenced=%d phantom=%d duplicates=%d resume=%v server_changes=%.0f recorded=%d\n",
		pick("short", "long"), c.manager, cfg.Kind, c.replication, l.ok.Load(), l.failed.Load(), len(onPrimary), sunk, lost,
		lostByDatabase, lostInFlight, lostUnpromised, len(unsequenced), sunk-(len(onPrimary)-lost), deliveries-sunk, resume.Round(time.Millisecond), changes, len(recorded))
	if lost != 0 {
		t.Errorf("%d events of the new primary never reached the sink", lost)
	}
	if len(unsequenced) != 0 {
		t.Errorf("%d events of the new primary were never given a position (stranded below the watermark?): %v",
			len(unsequenced), unsequenced)
	}
	switch {
	case c.replication == "sync" && lostByDatabase-lostUnpromised != 0:
		t.Errorf("%d acknowledged appends lost although their commits waited for the synchronous standby (%d acknowledged "+
			"after the primary began to fail; %d more lost that the HA manager did not promise to keep)",
			lostByDatabase-lostUnpromised, lostInFlight, lostUnpromised)
	case c.replication == "async" && lostByDatabase == 0:
		t.Errorf("the standby, cut off before the primary's last commits, lacks none of them: the scenario reused no position")
	}
	if first == nil {
		t.Errorf("no delivery was recorded on the new primary")
	}
	if changes == 0 {
		t.Errorf("no worker counted the server change")
	}
	if len(recorded) != 1 {
		t.Errorf("the failover record has %d entries, want the one failover: %+v", len(recorded), recorded)
	}
}

// replicateSynchronously makes every commit on pool's primary wait for
// its standby (synchronous_standby_names = '*'), and waits until the
// standby is replicated synchronously (pg_stat_replication.sync_state).
func replicateSynchronously(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	// The throwaway server runs with synchronous_commit = off (pgserver:
	// speed), which waits for no standby at all: turn it back to the
	// default, on, as a production primary has it.
	for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = '*'`, `ALTER SYSTEM SET synchronous_commit = on`,
		`SELECT pg_reload_conf()`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if !pgtest.WaitFor(time.Minute, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&n)
		return err == nil && n == 1
	}) {
		t.Fatal("the standby never replicated synchronously")
	}
}

// failoverRun reads the scenario's outcome on the database the URL leads
// to (the new primary, once promoted).
type failoverRun struct {
	t      *testing.T
	pool   *pgxpool.Pool
	store  *eventsource.Store
	schema string
}

// sinkCounts returns the sink's distinct events and all its deliveries
// (-1, -1 while the database cannot be read).
func (f *failoverRun) sinkCounts() (events, deliveries int) {
	err := f.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*), coalesce(sum(deliveries), 0) FROM %s.sink WHERE subscription = $1`,
		pgx.Identifier{f.schema}.Sanitize()), subscriptionName).Scan(&events, &deliveries)
	if err != nil {
		return -1, -1
	}
	return events, deliveries
}

// waitSunk waits until the sink's distinct events satisfy ok.
func (f *failoverRun) waitSunk(ok func(int) bool, what string) {
	f.t.Helper()
	if !pgtest.WaitFor(2*time.Minute, func() bool { n, _ := f.sinkCounts(); return ok(n) }) {
		n, _ := f.sinkCounts()
		f.t.Fatalf("%s: the sink has %d events", what, n)
	}
}

// eventIDs returns the ids of the category's events with a position.
func (f *failoverRun) eventIDs() map[uuid.UUID]bool {
	f.t.Helper()
	ids := map[uuid.UUID]bool{}
	for after := int64(0); ; {
		events, err := f.store.ReadCategory(context.Background(), categoryName, after, 5000)
		if err != nil {
			f.t.Fatalf("read the events: %v", err)
		}
		if len(events) == 0 {
			return ids
		}
		for _, e := range events {
			ids[e.ID] = true
		}
		after = events[len(events)-1].Position
	}
}

// settle waits until every event with a position is in the sink and the
// head has stopped moving, or no event reaches the sink for a minute, and
// returns how many never did.
func (f *failoverRun) settle() int {
	f.t.Helper()
	lastProgress, best, lastHead := time.Now(), -1, int64(-1)
	for time.Since(lastProgress) < time.Minute {
		head, herr := f.store.HeadPosition(context.Background())
		n, _ := f.sinkCounts()
		if herr == nil && n >= 0 && head == lastHead && n >= len(f.eventIDs()) && len(f.unsequenced()) == 0 {
			break
		}
		if n > best {
			best, lastProgress = n, time.Now()
		}
		lastHead = head
		time.Sleep(200 * time.Millisecond)
	}
	return f.missingFromSink(f.eventIDs())
}

// stored returns the ids of every event of the category the database has,
// with a position or not.
func (f *failoverRun) stored() map[uuid.UUID]bool {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), fmt.Sprintf(`SELECT event_id FROM %s.events WHERE category = $1`,
		pgx.Identifier{f.schema}.Sanitize()), categoryName)
	if err != nil {
		f.t.Fatalf("read the stored events: %v", err)
	}
	ids := map[uuid.UUID]bool{}
	var id uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { ids[id] = true; return nil }); err != nil {
		f.t.Fatalf("read the stored events: %v", err)
	}
	return ids
}

// unsequenced returns the stored events that have no position (yet): an
// append the sequencer has not numbered.
func (f *failoverRun) unsequenced() []uuid.UUID {
	f.t.Helper()
	positioned := f.eventIDs()
	var out []uuid.UUID
	for id := range f.stored() {
		if !positioned[id] {
			out = append(out, id)
		}
	}
	return out
}

// missingFromSink counts the ids with no sink row.
func (f *failoverRun) missingFromSink(ids map[uuid.UUID]bool) int {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), fmt.Sprintf(`SELECT event_id FROM %s.sink WHERE subscription = $1`,
		pgx.Identifier{f.schema}.Sanitize()), subscriptionName)
	if err != nil {
		f.t.Fatal(err)
	}
	sunk := map[uuid.UUID]bool{}
	var id uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { sunk[id] = true; return nil }); err != nil {
		f.t.Fatal(err)
	}
	missing := 0
	for id := range ids {
		if !sunk[id] {
			missing++
		}
	}
	return missing
}

// ackedLoad appends a steady load, each event with an id of its own, and
// keeps the ids of the appends acknowledged. The workers sequence.
type ackedLoad struct {
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	ok     atomic.Int64
	failed atomic.Int64
	mu     sync.Mutex
	acked  map[uuid.UUID]time.Time // when each append was acknowledged
}

// startAckedLoad appends about rate events a second on url.
func startAckedLoad(t *testing.T, url, schema string, rate int) *ackedLoad {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), withAppName(url, "appender"))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &ackedLoad{pool: pool, cancel: cancel, acked: map[uuid.UUID]time.Time{}}
	const appenders = 2
	every := time.Duration(int64(appenders) * int64(time.Second) / int64(rate))
	for a := range appenders {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				id := uuid.New()
				data, _ := json.Marshal(map[string]int{"appender": a, "n": n})
				actx, acancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := store.Append(actx, fmt.Sprintf("%s-%d-%d", categoryName, a, n%50), eventsource.Any,
					[]eventsource.EventData{{ID: id, Type: "Ticked", Data: data}})
				acancel()
				if err != nil {
					l.failed.Add(1) // the pool drops a dead connection; the next append finds the new primary
					continue
				}
				l.ok.Add(1)
				l.mu.Lock()
				l.acked[id] = time.Now()
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(l.stop)
	return l
}

// ackedTimes returns the acknowledged appends' ids, with when each was
// acknowledged.
func (l *ackedLoad) ackedTimes() map[uuid.UUID]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.acked)
}

func (l *ackedLoad) stop() {
	l.once.Do(func() {
		l.cancel()
		l.wg.Wait()
		l.pool.Close()
	})
}
