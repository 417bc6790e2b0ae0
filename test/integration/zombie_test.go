package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestZombie: a worker is frozen with SIGSTOP past its ttl while events
// flow; the others take its buckets once its leases expire (a frozen
// process keeps its session open, so even session leases wait for the
// expiry). Woken with SIGCONT, it must stop on its lost leases: no
// delivery starts between the moment its EnsureHeld had to fail (its last
// landed renewal + ttl − margin) and its next grant, no checkpoint of its
// lands, and it rejoins. Its late writes (the delivery in flight when it
// froze) are counted.
func TestZombie(t *testing.T) {
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 32, Kind: kind, HandlerDelay: time.Millisecond})
			e.startWorkers(4, startOpts{})
			e.startLoad(pick(150, 300), 200)
			time.Sleep(pick(time.Second, 5*time.Second))

			z := e.c.current("w1")
			watch := watchDeliveries(z)
			defer watch.stop()
			time.Sleep(200 * time.Millisecond)
			frozen := time.Now()
			e.c.pause(z)
			e.faults = append(e.faults, fault{worker: z.id, at: frozen})
			if _, ok := e.o.waitTakenFrom(z.id, 60*time.Second); !ok {
				t.Fatalf("the zombie's buckets were never taken: %s; its sessions:%s", e.o.ownedSummary(), e.o.sessionsOf(z.id))
			}
			time.Sleep(pick(time.Second, 10*time.Second))
			woke := time.Now()
			e.c.resume(z)
			at, ok := e.o.waitFairSplit(e.c.live, 60*time.Second)
			if !ok {
				t.Errorf("the zombie never rejoined: %s", e.o.ownedSummary())
			} else {
				e.joins = append(e.joins, at.Sub(woke))
			}
			time.Sleep(pick(time.Second, 5*time.Second))

			r := e.finish("zombie", func(r *report) {
				late, n := e.checkZombie(r, z, watch, woke)
				r.extra = append(r.extra, fmt.Sprintf("zombie_late_writes=%d zombie_deliveries_after_fence=%v", late, n))
			})
			requireSafe(t, r)
		})
	}
}

// checkZombie judges worker z, frozen and then thawed at woke, from the
// run's report r and the watch of its /metrics: it must have started no
// delivery between the moment its EnsureHeld had to fail (its last landed
// renewal before woke, plus ttl − margin) and its next grant. It returns
// its late writes (deliveries that landed after it lost the bucket: the
// one in flight when it froze) and the deliveries it started in that
// window, and fails the test for any such delivery, or a watch that never
// saw one.
func (e *env) checkZombie(r *report, z *proc, watch *deliveryWatch, woke time.Time) (late int64, started float64) {
	e.t.Helper()
	mustStop := e.o.lastPass(z.id, woke).Add(e.cfg.Lease.TTL - e.cfg.Lease.Margin)
	regrant := e.o.firstGrant(z.id, woke)
	n, first := watch.startedWithin(mustStop, regrant)
	for k, v := range r.staleByOwner {
		var w string
		var b int
		if _, err := fmt.Sscanf(k, "%s b%d", &w, &b); err == nil && w == z.id {
			late += v
		}
	}
	if ok, why := watch.readSince(woke); !ok {
		e.t.Errorf("the zombie's /metrics showed no delivery after it woke: %s", why)
	}
	if n > 0 {
		e.t.Errorf("zombie %s started %v deliveries after its leases could no longer be trusted (%v) and before its next grant (%v); first seen %v",
			z.id, n, mustStop.Format(time.StampMilli), regrant.Format(time.StampMilli), first.Format(time.StampMilli))
	}
	return late, n
}
