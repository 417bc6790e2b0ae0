package integration

import (
	"context"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestDatabaseRestart: PostgreSQL restarts (fast shutdown: every session
// is cut) mid-run, under load, while four workers run; they must recover
// with no manual action — every one of them owning its fair share again —
// and nothing may be lost. The scenario runs its own server, so the
// restart disturbs no other scenario.
func TestDatabaseRestart(t *testing.T) {
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			srv, err := pgtest.Start(ctx, pgtest.Options{})
			if err != nil {
				t.Fatalf("start a server of our own: %v", err)
			}
			t.Cleanup(srv.Stop)
			e := newEnv(t, srv.URL, clusterConfig{Buckets: 32, Kind: kind})
			procs := e.startWorkers(4, startOpts{})
			e.startLoad(pick(150, 300), 200)
			for i := range pick(1, 3) {
				time.Sleep(pick(2*time.Second, 15*time.Second))
				at := time.Now()
				if err := srv.Restart(ctx); err != nil {
					t.Fatalf("restart %d: %v", i+1, err)
				}
				down := time.Since(at)
				// Recovered: every worker has completed a pass and handled
				// an event since the restart, and the split is fair.
				working, ok := e.o.waitWorking(e.c.live(), at.Add(down), 90*time.Second)
				if !ok {
					t.Fatalf("the workers did not all work again after restart %d: %s", i+1, e.o.ownedSummary())
				}
				if _, ok := e.o.waitFairSplit(e.c.live, 90*time.Second); !ok {
					t.Fatalf("no fair split after restart %d: %s", i+1, e.o.ownedSummary())
				}
				// The time from the restart until every worker worked
				// again is this scenario's failover.
				e.failoverTimes = append(e.failoverTimes, working.Sub(at))
				t.Logf("restart %d: server down for %v, every worker working again after %v",
					i+1, down.Round(time.Millisecond), working.Sub(at).Round(time.Millisecond))
			}
			time.Sleep(pick(2*time.Second, 10*time.Second))
			for _, slot := range procs {
				if p := e.c.current(slot); p == nil || !p.running() || p.id != slot+".1" {
					t.Errorf("worker %s did not survive the restarts on its own", slot)
				}
			}
			r := e.finish("database-restart")
			requireSafe(t, r)
		})
	}
}
