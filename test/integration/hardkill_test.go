package integration

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestHardKills: four workers share 32 buckets under steady appends; every
// few seconds a random one is killed with SIGKILL and restarted under a
// new id. Nothing is lost, no checkpoint moves back, no lease is taken
// while valid; the failover time of each kill is reported. Session leases
// move a dead worker's buckets on the next pass (its session is gone, the
// evidence); row leases after the ttl.
func TestHardKills(t *testing.T) {
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 32, Kind: kind})
			slots := e.startWorkers(4, startOpts{})
			e.startLoad(pick(150, 300), 200)
			rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
			every := pick(2*time.Second, 4*time.Second)
			end := time.Now().Add(pick(10*time.Second, 60*time.Second))
			for next := time.Now().Add(every); next.Before(end); next = time.Now().Add(every/2 + time.Duration(rng.Int64N(int64(every)))) {
				sleepUntil(next)
				slot := slots[rng.IntN(len(slots))]
				p := e.c.current(slot)
				at := time.Now()
				e.c.kill(p)
				e.faults = append(e.faults, fault{worker: p.id, at: at})
				e.join(slot, startOpts{})
			}
			r := e.finish("hard-kills")
			requireSafe(t, r)
			if len(r.failovers) == 0 {
				t.Errorf("no failover measured")
			}
		})
	}
}
