package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/leasestore"
)

// resizeWorker is the test's stand-in for a worker: a lease store that
// holds every bucket and does a worker's part of a resize on demand.
type resizeWorker struct {
	t *testing.T
	b *bundle
	s *leasestore.Store
}

// pass runs a pass and returns the held leases by slot.
func (w *resizeWorker) pass() map[int]leasestore.Lease {
	w.t.Helper()
	res, err := w.s.Pass(context.Background())
	require.NoError(w.t, err)
	out := map[int]leasestore.Lease{}
	for _, l := range res.Owned {
		out[l.Slot] = l
	}
	return out
}

// propose proposes a bound for every held bucket of generation gen, and
// returns the last answer.
func (w *resizeWorker) propose(gen int) leasestore.Bound {
	w.t.Helper()
	var b leasestore.Bound
	for _, l := range w.pass() {
		if l.Generation != gen {
			continue
		}
		var err error
		b, err = w.s.ProposeCut(context.Background(), l.Slot, l.Epoch, 0)
		require.NoError(w.t, err)
	}
	return b
}

// drain drains the held buckets of generation gen whose bucket is in
// buckets (all when none is given) to the cut.
func (w *resizeWorker) drain(gen int, cut int64, buckets ...int) {
	w.t.Helper()
	want := map[int]bool{}
	for _, b := range buckets {
		want[b] = true
	}
	for _, l := range w.pass() {
		if l.Generation != gen || (len(buckets) > 0 && !want[l.Bucket]) {
			continue
		}
		require.NoError(w.t, pgx.BeginFunc(context.Background(), w.b.store.Pool(), func(tx pgx.Tx) error {
			return w.s.DrainTx(context.Background(), tx, l.Slot, l.Epoch, cut)
		}))
	}
}

func TestResizeCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := &resizeWorker{t: t, b: b, s: b.lease(t, "orders", "worker-a", 4)}
	require.Len(t, w.pass(), 4)

	t.Run("UsageErrors", func(t *testing.T) {
		for _, args := range [][]string{
			{"resize", "-s", "orders", "--buckets", "0"},
			{"resize", "-s", "orders", "--buckets", "65537"},
			{"resize", "-s", "orders", "--buckets", "-3"},
			{"resize", "-s", "orders", "--buckets", "8", "--cancel"},
			{"resize", "-s", "orders", "--no-wait"},
			{"resize", "--buckets", "8"},
		} {
			r := b.run(t, args...)
			require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
		}
	})
	t.Run("Refusals", func(t *testing.T) {
		r := b.run(t, "resize", "-s", "nope", "--buckets", "8")
		require.Equal(t, exitRuntime, r.code, r.stderr)
		require.Contains(t, r.stderr, `subscription "nope" is unknown`)
		r = b.run(t, "resize", "-s", "orders", "--buckets", "4")
		require.Equal(t, exitRuntime, r.code, r.stderr)
		require.Contains(t, r.stderr, "orders already has 4 buckets: nothing to do")
		r = b.run(t, "resize", "-s", "orders", "--cancel")
		require.Equal(t, exitRuntime, r.code, r.stderr)
		require.Contains(t, r.stderr, "orders has no resize running: nothing to cancel")
		r = b.run(t, "resize", "-s", "orders")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "orders: 4 buckets (generation 0), no resize running")
	})

	// Up 4 → 8, requested without waiting: the plan, then a second
	// request is refused, status shows it, a follower follows it to the
	// end while the worker does its part.
	r := b.run(t, "resize", "-s", "orders", "--buckets", "8", "--no-wait")
	require.Equal(t, exitOK, r.code, r.stderr)
	for _, want := range []string{
		"orders: 4 → 8 buckets (generation 0 → 1)",
		"index events_cg_8: built (concurrently) and valid",
		"workers: 1 live, all of protocol 2",
		"(gcd(4, 8) = 4: each new bucket waits for 1 old one)",
		"requested at ",
	} {
		require.Contains(t, r.stdout, want)
	}
	r = b.run(t, "resize", "-s", "orders", "--buckets", "6")
	require.Equal(t, exitRuntime, r.code, r.stderr)
	require.Contains(t, r.stderr, "orders is already resizing 4 → 8 (state sealing, requested ")
	require.Contains(t, r.stderr, "cancel it or wait")

	require.Len(t, w.pass(), 12, "the worker holds the new buckets too, on standby")
	r = b.run(t, "status", "-s", "orders")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "resizing: generation 0 → 1, 4 → 8 buckets, state sealing, cut not decided")
	require.Regexp(t, `(?m)^1\s+5\s+worker-a\s+.*standby \(waits for old buckets ≡ 1 mod 4\)$`, r.stdout)
	r = b.run(t, "status", "-s", "orders", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	st := decode[statusOut](t, r.stdout)
	require.NotNil(t, st.Resize)
	require.Equal(t, "sealing", st.Resize.State)
	require.Equal(t, 8, st.Resize.NextBuckets)
	require.Len(t, st.Buckets, 12, "both generations' buckets")

	follow := make(chan result, 1)
	go func() { follow <- b.run(t, "resize", "-s", "orders", "--json") }()
	bound := w.propose(0)
	require.True(t, bound.Decided, "the last proposal decides the cut")
	r = b.run(t, "status", "-s", "orders")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^0\s+2\s+worker-a\s+.*draining to the cut$`, r.stdout)
	w.drain(0, bound.Limit)
	w.pass()
	r = <-follow
	require.Equal(t, exitOK, r.code, r.stderr)
	done := decode[resizeOut](t, r.stdout)
	require.Equal(t, "steady", done.State)
	require.Equal(t, 1, done.Generation)
	require.Equal(t, 8, done.Buckets)

	// Down 8 → 2, cancelled before the switch: back to 8.
	r = b.run(t, "resize", "-s", "orders", "--buckets", "2", "--no-wait", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, "sealing", decode[resizeOut](t, r.stdout).State)
	r = b.run(t, "resize", "-s", "orders", "--cancel")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "orders: resize cancelled; 8 buckets (generation 1)")

	// 8 → 16 past its switch: too late to cancel; then it completes.
	r = b.run(t, "resize", "-s", "orders", "--buckets", "16", "--no-wait")
	require.Equal(t, exitOK, r.code, r.stderr)
	bound = w.propose(1)
	require.True(t, bound.Decided)
	w.drain(1, bound.Limit, 3)
	r = b.run(t, "resize", "-s", "orders", "--cancel")
	require.Equal(t, exitRuntime, r.code, r.stderr)
	require.Contains(t, r.stderr, "too late to cancel: the resize of orders (8 → 16) switched at ")
	follow = make(chan result, 1)
	go func() { follow <- b.run(t, "resize", "-s", "orders") }()
	w.drain(1, bound.Limit)
	w.pass()
	r = <-follow
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "done      generation 2, 16 buckets")
}
