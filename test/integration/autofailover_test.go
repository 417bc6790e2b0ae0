package integration

import (
	"context"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestPrimaryFailoverUnderPgAutoFailover is TestPrimaryFailover under a
// real HA manager: a pg_auto_failover formation (a monitor and two nodes,
// each under its pg_autoctl keeper; the standby synchronous, as
// pg_auto_failover makes it with two nodes), with the workers and the
// appenders on a multi-host URL of both nodes. The monitor, not the test,
// promotes the standby: on a planned `pg_autoctl perform failover`
// (switchover), and when the primary's machine dies (kill -9 of its keeper
// and its postgres: the monitor gives it up after its health checks fail).
// Nothing acknowledged may be lost, and every event of the new primary is
// delivered.
func TestPrimaryFailoverUnderPgAutoFailover(t *testing.T) {
	for _, how := range []string{"switchover", "kill"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			paf, err := pgtest.StartAutoFailover(ctx)
			if err != nil {
				t.Fatalf("start a pg_auto_failover formation: %v", err)
			}
			t.Cleanup(paf.Stop)
			kind := leasestore.KindRow
			if how == "kill" {
				kind = leasestore.KindSession
			}
			runFailover(ctx, t, failoverCase{kind: kind, url: paf.URL(), manager: "pg_auto_failover-" + how, replication: "sync",
				fail: func() {
					start := time.Now()
					var to string
					var err error
					if how == "switchover" {
						to, err = paf.PerformFailover(ctx)
					} else {
						to, err = paf.KillPrimary(ctx)
					}
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("%s: %s is primary %v later", how, to, time.Since(start).Round(time.Millisecond))
				}})
		})
	}
}
