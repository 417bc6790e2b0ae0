package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestNetworkCut: one of four workers reaches the database through a proxy
// that cuts it off — blackhole (bytes vanish, the server still sees its
// sessions) or drop (connections closed, new ones refused) — while events
// flow. It must stop starting deliveries no later than its margin allows
// (its last landed renewal + ttl − margin, by the rule of EnsureHeld); the
// others take its buckets once its leases expire; healed, it rejoins; and
// nothing is lost.
func TestNetworkCut(t *testing.T) {
	for _, mode := range []string{"blackhole", "drop"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 32, Kind: leasestore.KindRow, HandlerDelay: time.Millisecond})
			cut := e.c.start("w1", startOpts{viaProxy: true})
			for _, s := range []string{"w2", "w3", "w4"} {
				e.c.start(s, startOpts{})
			}
			if _, ok := e.o.waitFairSplit(e.c.live, 90*time.Second); !ok {
				t.Fatalf("no fair split: %s", e.o.ownedSummary())
			}
			e.startLoad(pick(150, 300), 200)
			watch := watchDeliveries(cut)
			defer watch.stop()
			time.Sleep(pick(time.Second, 5*time.Second))

			at := time.Now()
			if mode == "blackhole" {
				cut.proxy.cutBlackhole()
			} else {
				cut.proxy.cutDrop()
			}
			e.faults = append(e.faults, fault{worker: cut.id, at: at})
			e.c.markCut(cut, true)
			if _, ok := e.o.waitTakenFrom(cut.id, 60*time.Second); !ok {
				t.Fatalf("the cut worker's buckets were never taken: %s; its sessions:%s", e.o.ownedSummary(), e.o.sessionsOf(cut.id))
			}
			// Long enough, in the long form, for a handler's write to time
			// out (10 s) and be retried while still cut off.
			time.Sleep(pick(2*time.Second, 15*time.Second))
			healed := time.Now()
			cut.proxy.heal()
			e.c.markCut(cut, false)
			if at, ok := e.o.waitFairSplit(e.c.live, 60*time.Second); !ok {
				t.Errorf("the cut worker never rejoined: %s", e.o.ownedSummary())
			} else {
				e.joins = append(e.joins, at.Sub(healed))
			}
			time.Sleep(pick(time.Second, 5*time.Second))

			r := e.finish("network-cut-"+mode, func(r *report) {
				mustStop := e.o.lastPass(cut.id, healed).Add(e.cfg.Lease.TTL - e.cfg.Lease.Margin)
				regrant := e.o.firstGrant(cut.id, healed)
				n, first := watch.startedWithin(mustStop, regrant)
				r.extra = append(r.extra, fmt.Sprintf("cut_deliveries_after_margin=%v dead_letters=%d", n, e.o.deadLetters()))
				if ok, why := watch.readSince(healed); !ok {
					t.Errorf("the cut worker's /metrics showed no delivery after it was healed: %s", why)
				}
				if n > 0 {
					t.Errorf("cut worker %s started %v deliveries after its leases could no longer be trusted (%v) and before its next grant (%v); first seen %v",
						cut.id, n, mustStop.Format(time.StampMilli), regrant.Format(time.StampMilli), first.Format(time.StampMilli))
				}
			})
			requireSafe(t, r)
		})
	}
}
