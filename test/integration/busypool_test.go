package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestBusyPoolKeepsLeases: 64 buckets with a backlog, two workers whose
// pool has a single connection and whose handler writes every delivery to
// the database in a fenced transaction (the sink, exactly-once), steady
// appends, and the 3 s ttl / 0.5 s heartbeat / 1 s margin profile. Each
// worker's pool is as busy as its readers and handlers can make it; the
// lease passes have connections of their own and carry no lag query, so
// no lease is lost: no takeover of an expired lease, no reader stopped on
// a lost or unsure lease, nothing delivered twice — and /healthz stays ok.
// (With the lag query on the pass and one shared pool, under -race as CI
// runs it: readers stopped on unsure leases 79 times, 9 late passes, 21
// failed health probes.)
func TestBusyPoolKeepsLeases(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{
		Buckets: 64, Kind: leasestore.KindRow, PoolConns: 1, Exactly: true,
		Lease: leaseTimings{TTL: 3 * time.Second, Heartbeat: 500 * time.Millisecond, Margin: time.Second},
	})
	backlog := pick(15000, 100000)
	appendBacklog(t, e, backlog, 200)
	slots := e.startWorkers(2, startOpts{})
	e.startLoad(pick(200, 300), 200)
	var probes []*healthProbe
	for _, slot := range slots {
		probes = append(probes, probeHealth(e.c.current(slot)))
	}
	time.Sleep(pick(8*time.Second, 60*time.Second))
	var readerLosses, late float64
	unhealthy := int64(0)
	r := e.finish("busy-pool", func(r *report) {
		for _, slot := range slots {
			p := e.c.current(slot)
			readerLosses += scrapeLabeled(p, "kumi_ownership_changes_total", `kumi_change="fence_lost"`) +
				scrapeLabeled(p, "kumi_ownership_changes_total", `kumi_change="renew_failed"`)
			late += scrapeLabeled(p, "kumi_lease_passes_late_total", "")
		}
		for _, hp := range probes {
			hp.stop()
			unhealthy += hp.bad.Load()
		}
		r.extra = append(r.extra, fmt.Sprintf("backlog=%d pool_conns=1 lease_losses=%d reader_losses=%v late_passes=%v unhealthy_probes=%d",
			backlog, r.expired+r.overlaps, readerLosses, late, unhealthy))
	})
	requireSafe(t, r)
	if r.expired+r.overlaps != 0 {
		t.Errorf("busy-pool: %d leases lapsed and were taken over (%d expired, %d overlaps)", r.expired+r.overlaps, r.expired, r.overlaps)
	}
	if readerLosses != 0 {
		t.Errorf("busy-pool: readers stopped %v times on a lost or unsure lease", readerLosses)
	}
	if r.duplicates != 0 {
		t.Errorf("busy-pool: %d events delivered twice", r.duplicates)
	}
	if unhealthy != 0 {
		t.Errorf("busy-pool: /healthz failed %d times on a worker that kept its leases", unhealthy)
	}
}

// TestConfigErrorEndsTheWorker: two healthy workers share 16 buckets under
// steady appends; a third joins under a role that may not read the
// checkpoints table, so its readers fail with 42501 (a configuration
// error no restart cures). The third worker's group ends visibly: it logs
// the cause and the fix, releases its leases and exits with an error; the
// healthy workers take its buckets over at once — by its release, never
// by waiting for the leases to expire — and nothing is lost.
func TestConfigErrorEndsTheWorker(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 16, Kind: leasestore.KindRow})
	e.startWorkers(2, startOpts{})
	e.startLoad(pick(150, 300), 100)
	role := restrictedRole(t, e, "REVOKE SELECT ON %s.checkpoints FROM %s")
	bad := e.c.start("w3", startOpts{user: role})
	err := e.c.expectExit(bad, 90*time.Second)
	if err == nil {
		t.Errorf("%s exited with status 0 after its group failed", bad.id)
	}
	line := grepFile(bad.logPath, "kumi: group stopped:")
	if line == "" || !strings.Contains(line, "42501") || !strings.Contains(line, "grant") {
		t.Errorf("%s did not log the cause and the fix:\n%s", bad.id, tail(bad.logPath, 30))
	}
	if grepFile(bad.logPath, "leases_released=true") == "" {
		t.Errorf("%s did not release its leases:\n%s", bad.id, tail(bad.logPath, 30))
	}
	held := e.o.grantsTo(bad.id)
	if held == 0 {
		t.Errorf("%s never held a bucket: the scenario tested nothing\n%s", bad.id, tail(bad.logPath, 30))
	}
	if _, ok := e.o.waitFairSplit(e.c.live, 60*time.Second); !ok {
		t.Errorf("the healthy workers did not take the buckets back: %s", e.o.ownedSummary())
	}
	time.Sleep(pick(3*time.Second, 30*time.Second))
	r := e.finish("config-error", func(r *report) {
		r.extra = append(r.extra, fmt.Sprintf("failed_worker=%s buckets_granted=%d exit=%q",
			bad.id, held, fmt.Sprint(err)))
	})
	requireSafe(t, r)
	if r.expired+r.overlaps != 0 {
		t.Errorf("config-error: %d buckets waited for their leases to expire instead of being released", r.expired+r.overlaps)
	}
}

// grantsTo counts the leases granted to worker (from the lease log).
func (o *observer) grantsTo(worker string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int
	if err := o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.obs_lease_log
		WHERE subscription = $1 AND new_owner = $2 AND old_owner IS DISTINCT FROM new_owner`, o.q), o.sub, worker).Scan(&n); err != nil {
		o.t.Fatalf("observer: lease log: %v", err)
	}
	return n
}

// restrictedRole creates a login role with every privilege on the
// scenario's schema, then applies revoke (a format with the schema and the
// role), and drops the role at the end.
func restrictedRole(t *testing.T, e *env, revoke string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "kumi_restricted_" + hex.EncodeToString(b[:])
	q, r := pgx.Identifier{e.cfg.Schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		"CREATE ROLE " + r + " LOGIN",
		"GRANT USAGE, CREATE ON SCHEMA " + q + " TO " + r,
		"GRANT ALL ON ALL TABLES IN SCHEMA " + q + " TO " + r,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA " + q + " TO " + r,
		fmt.Sprintf(revoke, q, r),
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pool, err := pgxpool.New(ctx, e.url)
		if err != nil {
			return
		}
		defer pool.Close()
		_, _ = pool.Exec(ctx, "DROP OWNED BY "+r)
		_, _ = pool.Exec(ctx, "DROP ROLE IF EXISTS "+r)
	})
	return role
}

// scrapeLabeled sums the samples on p's /metrics whose name starts with
// prefix and whose line contains label ("" for every one).
func scrapeLabeled(p *proc, prefix, label string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := &http.Client{}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+"/metrics", nil)
	if err != nil {
		return 0
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) || !strings.Contains(line, label) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return total
}

// healthProbe polls a worker's /healthz (directly, never through a proxy)
// and counts the answers that were not 200.
type healthProbe struct {
	bad    atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func probeHealth(p *proc) *healthProbe {
	ctx, cancel := context.WithCancel(context.Background())
	h := &healthProbe{cancel: cancel}
	client := &http.Client{Timeout: time.Second}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer client.CloseIdleConnections()
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+"/healthz", nil)
			if resp, err := client.Do(req); err == nil {
				if resp.StatusCode != http.StatusOK {
					h.bad.Add(1)
				}
				_ = resp.Body.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return h
}

func (h *healthProbe) stop() {
	h.cancel()
	h.wg.Wait()
}
