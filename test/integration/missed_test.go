package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestMissedPassesCountPassesThatCouldClaim: max_missed_passes counts the
// passes a freed bucket's next owner began while the bucket was free for
// it, and only those. Three workers run as stores in this process,
// passing when told, on the scenario's schema and under their own
// application_name, as the worker processes do:
//
//   - a holds both buckets; c joins and places a two-phase claim on
//     bucket 1; a hands it over: the bucket is free, but c's (no other
//     worker may take it while c's claim is fresh). d starts — its
//     Store.Start registers it, a heartbeat that is no pass — and passes:
//     it cannot take the bucket. c leaves, its claim withdrawn, and d's
//     next pass claims it: no pass missed (counting every heartbeat of d
//     since the handover made two);
//   - a leaves, freeing bucket 0; e starts and its first pass claims it:
//     no pass missed (e's registration is no pass);
//   - d releases bucket 1, and its next pass, which sees it free, finds
//     its row locked (a claim skips locked rows) and claims nothing; the
//     pass after claims it: one pass missed, still counted.
func TestMissedPassesCountPassesThatCouldClaim(t *testing.T) {
	const ttl = 30 * time.Second // nothing lapses meanwhile
	e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 2, Kind: leasestore.KindRow,
		Lease: leaseTimings{TTL: ttl, Heartbeat: ttl / 5, Margin: ttl / 3}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pass := func(s *leasestore.Store) leasestore.PassResult {
		t.Helper()
		res, err := s.Pass(ctx)
		if err != nil {
			t.Fatalf("pass of %s: %v", s.Worker(), err)
		}
		return res
	}
	claimed := func(res leasestore.PassResult) []int {
		var out []int
		for _, l := range res.Claimed {
			out = append(out, l.Bucket)
		}
		return out
	}

	a := leaseStoreAs(t, e, "a")
	if got := claimed(pass(a)); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("a, alone, claimed %v, want [0 1]", got)
	}
	c := leaseStoreAs(t, e, "c")
	if res := pass(c); !slices.Equal(res.Requested, []leasestore.Request{{Bucket: 1, Owner: "a"}}) {
		t.Fatalf("c, joining, placed %v, want a claim on a's bucket 1", res.Requested)
	}
	if res := pass(a); !slices.Equal(res.HandOff, []int{1}) {
		t.Fatalf("a's pass after c's claim: hand off %v, want [1]", res.HandOff)
	}
	if err := a.HandOver(ctx, 1); err != nil {
		t.Fatal(err)
	}
	d := leaseStoreAs(t, e, "d")
	if res := pass(d); len(res.Claimed) > 0 || len(res.Requested) > 0 {
		t.Fatalf("d's pass while bucket 1 is c's: claimed %v, placed %v; want nothing", claimed(res), res.Requested)
	}
	if err := c.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if got := claimed(pass(d)); !slices.Equal(got, []int{1}) {
		t.Fatalf("d's pass after c left claimed %v, want [1]", got)
	}
	if r := e.o.collect("missed-passes-reserved", e.cfg.Kind.String(), nil); r.maxMissed != 0 {
		t.Errorf("bucket 1, handed over to c's claim and taken by d once c left: max_missed_passes=%d, want 0 "+
			"(d's passes while c's claim held it could not take it)", r.maxMissed)
	}

	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if got := claimed(pass(leaseStoreAs(t, e, "e"))); !slices.Equal(got, []int{0}) {
		t.Fatalf("e's first pass after a left claimed %v, want [0]", got)
	}
	if r := e.o.collect("missed-passes-joiner", e.cfg.Kind.String(), nil); r.maxMissed != 0 {
		t.Errorf("bucket 0, released by a and claimed by e's first pass: max_missed_passes=%d, want 0", r.maxMissed)
	}

	if err := d.Release(ctx, []int{1}); err != nil {
		t.Fatal(err)
	}
	lock, err := e.o.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.lease_buckets WHERE subscription = $1 AND bucket = 1 FOR UPDATE`, e.o.q),
		e.cfg.Subscription); err != nil {
		t.Fatal(err)
	}
	if got := claimed(pass(d)); len(got) > 0 {
		t.Fatalf("d's pass while bucket 1's row is locked claimed %v, want nothing", got)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := claimed(pass(d)); !slices.Equal(got, []int{1}) {
		t.Fatalf("d's pass after the lock claimed %v, want [1]", got)
	}
	if r := e.o.collect("missed-passes-locked", e.cfg.Kind.String(), nil); r.maxMissed != 1 {
		t.Errorf("bucket 1, released by d and claimed by it one pass late: max_missed_passes=%d, want 1", r.maxMissed)
	}
}

// leaseStoreAs returns a started lease store of e's subscription for
// worker id, on a pool whose sessions are named id (as the worker
// processes' are), without wake-ups: it passes when the test says. Both
// end with the test.
func leaseStoreAs(t *testing.T, e *env, id string) *leasestore.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), withAppName(e.url, id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := leasestore.New(pool, leasestore.Config{Schema: e.cfg.Schema,
		Subscription: e.cfg.Subscription, Worker: id, Buckets: e.cfg.Buckets, LeaseOptions: leasestore.LeaseOptions{Kind: e.cfg.Kind, TTL: e.cfg.Lease.TTL, Heartbeat: e.cfg.Lease.Heartbeat, Margin: e.cfg.Lease.Margin, NoListen: true},
	})
	if err == nil {
		err = s.Start(context.Background())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop %s: %v", id, err)
		}
	})
	return s
}
