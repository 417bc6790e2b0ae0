package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestRollingRestart: every worker in turn is stopped gracefully (SIGTERM:
// drain, flush, release) and replaced by a new process, under load. A
// graceful handoff loses nothing and duplicates nothing, and no bucket is
// left unowned for longer than one pass: its next owner claims it in the
// first pass it begins once the bucket is free for it, or the one after
// (that pass's claim may find the row locked by another transaction: a
// claim skips locked rows rather than wait). Free for it: released, or its
// lease lapsed, and no other worker's two-phase claim on it — a bucket
// released or handed over with a claim on it is the claimant's until the
// claim is withdrawn or lapses. A pass begins with its first statement's
// snapshot, not its clock, and a worker's registration as it starts is no
// pass (observer.missedPasses, TestMissedPassesCountPassesThatCouldClaim).
func TestRollingRestart(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 32, Kind: leasestore.KindRow})
	slots := e.startWorkers(4, startOpts{})
	e.startLoad(pick(150, 300), 200)
	for round := range pick(1, 3) {
		for _, slot := range slots {
			time.Sleep(pick(500*time.Millisecond, 3*time.Second))
			e.c.stop(e.c.current(slot), 60*time.Second)
			e.join(slot, startOpts{})
		}
		t.Logf("round %d done", round+1)
	}
	time.Sleep(pick(time.Second, 5*time.Second))
	r := e.finish("rolling-restart", func(r *report) {
		r.extra = append(r.extra, fmt.Sprintf("restarts=%d", pick(1, 3)*len(slots)))
	})
	requireSafe(t, r)
	if r.duplicates != 0 {
		t.Errorf("a graceful handoff delivered %d events twice", r.duplicates)
	}
	if r.stale != 0 {
		t.Errorf("%d deliveries landed from a worker that had handed its bucket over: %v", r.stale, r.staleByOwner)
	}
	if r.maxMissed > 1 {
		t.Errorf("a bucket stayed unowned while its next owner began %d passes without claiming it", r.maxMissed)
	}
}
