package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/pgserver"
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
// Every event of the new primary is delivered, and nothing is lost that
// pg_auto_failover promised to keep: an append acknowledged while the
// monitor had the primary reported as primary (with its synchronous
// standby), or once the new primary reported itself. It does not promise
// the appends acknowledged while the primary ran without its standby
// (wait_primary: on a loaded machine the monitor may mark the standby
// unhealthy for a while), nor, in a switchover, those acknowledged between
// the request and the new primary's report (the monitor promotes once its
// demote timeout expires, whether the old primary has stopped or not):
// those are reported as lost_unpromised.
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
			t.Cleanup(func() {
				// Runs before Stop: what the monitor did (shown when the case
				// fails, or with -v).
				events, err := paf.Events(context.Background())
				for _, e := range events {
					t.Logf("monitor: %v", e)
				}
				if err != nil {
					t.Logf("monitor events: %v", err)
				}
			})
			kind := leasestore.KindRow
			if how == "kill" {
				kind = leasestore.KindSession
			}
			var old, to string
			var start time.Time
			runFailover(ctx, t, failoverCase{kind: kind, url: paf.URL(), manager: "pg_auto_failover-" + how, replication: "sync",
				fail: func() {
					var err error
					if old, err = paf.Primary(ctx); err != nil {
						t.Fatal(err)
					}
					start = time.Now()
					if how == "switchover" {
						to, err = paf.PerformFailover(ctx)
					} else {
						to, err = paf.KillPrimary(ctx)
					}
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("%s: %s is primary %v later", how, to, time.Since(start).Round(time.Millisecond))
				},
				promised: func() func(time.Time) bool {
					events, err := paf.Events(ctx)
					if err != nil {
						t.Fatalf("the monitor's events: %v", err)
					}
					return promisedBy(events, old, to, start, how == "switchover")
				}})
		})
	}
}

// promisedBy tells, from the monitor's events, whether pg_auto_failover
// promised to keep an append acknowledged at a time: while old was
// reported primary (before start, in a switchover), or once to reported
// itself primary or wait_primary after start.
func promisedBy(events []pgserver.Event, old, to string, start time.Time, switchover bool) func(time.Time) bool {
	type report struct {
		at    time.Time
		state string
	}
	var reports []report // old's reports, in order
	var takenOver time.Time
	for _, e := range events {
		if !strings.HasPrefix(e.Description, "New state is reported") {
			continue
		}
		switch {
		case e.Node == old:
			reports = append(reports, report{e.At, e.Reported})
		case e.Node == to && takenOver.IsZero() && !e.At.Before(start) && (e.Reported == "primary" || e.Reported == "wait_primary"):
			takenOver = e.At
		}
	}
	return func(at time.Time) bool {
		if !takenOver.IsZero() && !at.Before(takenOver) {
			return true
		}
		if switchover && !at.Before(start) {
			return false
		}
		state := ""
		for _, r := range reports {
			if r.at.After(at) {
				break
			}
			state = r.state
		}
		return state == "primary"
	}
}

// TestPromisedByReadsTheMonitorsEvents: promisedBy's windows on a made-up
// event log — the old primary's wait_primary spell and the switchover are
// not promised; its primary spells and the new primary's reign are.
func TestPromisedByReadsTheMonitorsEvents(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	reported := func(s int, node, state string) pgserver.Event {
		return pgserver.Event{At: at(s), Node: node, Reported: state, Goal: state, Description: "New state is reported by " + node}
	}
	events := []pgserver.Event{
		reported(1, "node_1", "wait_primary"),
		reported(2, "node_1", "primary"),
		reported(4, "node_1", "wait_primary"),
		{At: at(5), Node: "node_1", Reported: "wait_primary", Goal: "primary", Description: "Setting goal state"},
		reported(6, "node_1", "primary"),
		reported(12, "node_1", "draining"),
		reported(14, "node_2", "wait_primary"),
	}
	for _, c := range []struct {
		switchover bool
		at         int
		want       bool
	}{
		{true, 0, false}, {true, 1, false}, {true, 3, true}, {true, 4, false}, {true, 5, false}, {true, 7, true},
		{true, 10, false}, {true, 13, false}, {true, 14, true}, {true, 20, true},
		{false, 3, true}, {false, 10, true}, {false, 12, false}, {false, 14, true},
	} {
		if got := promisedBy(events, "node_1", "node_2", at(10), c.switchover)(at(c.at)); got != c.want {
			t.Errorf("switchover=%v, acknowledged at %ds: promised %v, want %v", c.switchover, c.at, got, c.want)
		}
	}
}
