package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestResizeFrozenDrainer: three workers serve 8 buckets under steady
// appends; the subscription is resized to 16 (long form: and back to 8,
// twice) behind a backlog, and once the cut is decided a worker draining
// an old bucket is frozen with SIGSTOP while that bucket is still
// undrained (checked after the freeze: the resize runs and the frozen
// worker holds an undrained old bucket). The resize must complete without
// it: its leases lapse, other workers take its old buckets and drain them
// to the cut (checked: every such drain is another worker's). Then it is
// thawed with SIGCONT — a zombie, which must start no delivery once its
// leases can no longer be trusted and must rejoin — or, every other
// resize of the long form, killed with SIGKILL while still frozen and
// restarted. Invariants of TestResizeUp; duplicates only those first
// delivered by the frozen worker (docs/guarantees.md: a zombie after a
// lease loss, a crash).
func TestResizeFrozenDrainer(t *testing.T) {
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			// A handler delay of 3 ms (one event at a time per bucket)
			// and the backlog keep every old bucket draining for seconds
			// after the cut, on an idle machine too: the freeze lands
			// while one is undrained.
			e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 8, Kind: kind, HandlerDelay: 3 * time.Millisecond})
			e.startWorkers(3, startOpts{})
			e.startLoad(pick(150, 300), 200)
			e.o.waitHandled(t, 50, time.Minute)
			targets := pick([]int{16}, []int{16, 8, 16, 8})
			frozen := map[string]bool{}
			var frozenBuckets, thawed, killed int
			var zombies []zombie
			for i, m := range targets {
				e.appendBacklog(pick(12000, 20000), 200)
				rs := e.resize(m)
				z, held, at := e.freezeDrainer(m)
				frozen[z.id] = true
				frozenBuckets += len(held)
				e.faults = append(e.faults, fault{worker: z.id, at: at})
				var watch *deliveryWatch
				if i%2 == 0 {
					watch = watchDeliveries(z)
					defer watch.stop()
				}
				done := e.waitResize(func(r leasestore.Resize) bool { return !r.Resizing() && r.Generation > rs.Generation })
				if done.Buckets != m {
					t.Fatalf("resized to %d buckets, want %d", done.Buckets, m)
				}
				e.requireDrainedByOthers(z.id, held)
				if watch != nil {
					woke := time.Now()
					e.c.resume(z)
					zombies = append(zombies, zombie{p: z, watch: watch, woke: woke})
					thawed++
				} else {
					e.c.kill(z)
					e.c.start(z.slot, startOpts{})
					killed++
				}
				if _, ok := e.o.waitFairSplit(e.c.live, time.Minute); !ok {
					cur := e.c.current(z.slot)
					t.Errorf("no fair split of the %d buckets after %s was thawed or restarted: %s\n%s's /status: %s\nits sessions:%s\nits log's tail:\n%s",
						m, z.id, e.o.ownedSummary(), cur.id, rawStatus(cur), e.o.sessionsOf(cur.id), tail(cur.logPath, 40))
				}
			}
			var rr resizeReport
			r := e.finish("resize-frozen", func(r *report) {
				rr = e.o.resizeReport(t, nil, frozen)
				var late int64
				var started float64
				for _, z := range zombies {
					l, n := e.checkZombie(r, z.p, z.watch, z.woke)
					late, started = late+l, started+n
				}
				r.extra = append(r.extra, rr.fields(), fmt.Sprintf("frozen_during_resize=%d/%d frozen_buckets=%d thawed=%d killed=%d zombie_late_writes=%d zombie_deliveries_after_fence=%v",
					len(targets), len(targets), frozenBuckets, thawed, killed, late, started))
			})
			requireSafe(t, r)
			requireResizeSafe(t, r.scenario, rr, len(targets))
		})
	}
}

// zombie is a worker that was frozen and thawed, and the watch of its
// deliveries (checkZombie).
type zombie struct {
	p     *proc
	watch *deliveryWatch
	woke  time.Time
}

// freezeDrainer waits until the running resize to m has decided its cut,
// then freezes (SIGSTOP) a worker that holds an old bucket not drained
// yet, and returns it, the old buckets it holds undrained as read once it
// is stopped and has nothing left in flight at the database, and when it
// was frozen. A worker that drained its last old bucket meanwhile is
// thawed and another is chosen; the test fails if the resize ends before
// one is caught, or after 10 tries.
func (e *env) freezeDrainer(m int) (*proc, []leasestore.SlotStatus, time.Time) {
	e.t.Helper()
	for range 10 {
		cur := e.waitResize(func(r leasestore.Resize) bool { return r.CutDecided || !r.Resizing() })
		victim := undrainedOwner(cur, "")
		if victim == nil || !cur.Resizing() {
			e.t.Fatalf("the resize to %d ended before a worker draining an old bucket could be frozen: %+v", m, cur)
		}
		p := e.c.byID(victim.Owner)
		if p == nil {
			e.t.Fatalf("no process runs %s (holder of old bucket %d)", victim.Owner, victim.Bucket)
		}
		at := time.Now()
		e.c.pause(p)
		e.waitFrozen(p)
		after, ok := e.readResize()
		if held := undrainedOf(after, p.id); ok && after.Resizing() && len(held) > 0 {
			return p, held, at
		}
		e.c.resume(p)
	}
	e.t.Fatalf("the resize to %d: no worker was caught holding an undrained old bucket in 10 tries", m)
	return nil, nil, time.Time{}
}

// waitFrozen waits until p is stopped (its state in /proc is T) and none
// of its sessions runs a statement, but for one waiting on a lock (which
// may be its own other, frozen, transaction's): nothing of it can commit
// any more, as its transactions' COMMITs are the frozen process's to send.
func (e *env) waitFrozen(p *proc) {
	e.t.Helper()
	stat := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	q := `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'
		AND wait_event_type IS DISTINCT FROM 'Lock'`
	var state string
	var active int64 = -1
	if !pgtest.WaitFor(30*time.Second, func() bool {
		b, err := os.ReadFile(stat)
		if err != nil {
			return false
		}
		// pid (comm) state …: the comm may hold spaces, the state follows
		// its closing parenthesis.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) == 0 {
			return false
		}
		state = fields[0]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return state == "T" && e.o.pool.QueryRow(ctx, q, p.id).Scan(&active) == nil && active == 0
	}) {
		e.t.Fatalf("%s did not freeze: state %q, %d sessions active", p.id, state, active)
	}
}

// undrainedOf returns the old buckets worker holds undrained in a running
// resize.
func undrainedOf(r leasestore.Resize, worker string) []leasestore.SlotStatus {
	var out []leasestore.SlotStatus
	for _, s := range r.Old {
		if s.Owner == worker && !s.Drained {
			out = append(out, s)
		}
	}
	return out
}

// requireDrainedByOthers fails the test unless every one of held (old
// buckets the frozen worker held undrained) drained, each by a worker
// other than frozen: the resize did not wait for it.
func (e *env) requireDrainedByOthers(frozen string, held []leasestore.SlotStatus) {
	e.t.Helper()
	slots := make([]int32, len(held))
	for i, s := range held {
		slots[i] = int32(s.Slot)
	}
	rows, err := e.o.pool.Query(context.Background(), fmt.Sprintf(`SELECT bucket, app FROM %s.obs_drain_log
		WHERE subscription = $1 AND bucket = ANY($2)`, e.o.q), e.o.sub, slots)
	if err != nil {
		e.t.Fatalf("observer: drains: %v", err)
	}
	defer rows.Close()
	by := map[int]string{}
	for rows.Next() {
		var slot int
		var app string
		if err := rows.Scan(&slot, &app); err != nil {
			e.t.Fatalf("observer: drains: %v", err)
		}
		by[slot] = app
	}
	if err := rows.Err(); err != nil {
		e.t.Fatalf("observer: drains: %v", err)
	}
	for _, s := range held {
		switch app, ok := by[s.Slot]; {
		case !ok:
			e.t.Errorf("old bucket %d (slot %d), held by frozen %s, never drained", s.Bucket, s.Slot, frozen)
		case app == frozen:
			e.t.Errorf("old bucket %d (slot %d) was drained by %s, which was frozen", s.Bucket, s.Slot, frozen)
		}
	}
	gen, _ := eventsource.SlotBucket(held[0].Slot)
	e.t.Logf("generation %d: %d old buckets of frozen %s drained by others: %v", gen, len(held), frozen, by)
}
