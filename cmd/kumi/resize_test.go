package main

import (
	"bufio"
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
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
	r = b.run(t, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^orders\s+4\s+.*resizing 4 → 8, sealing$`, r.stdout)

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
	// The follower prints where the resize stands when it starts: the
	// rest of the drains only once it has, so it sees the completion.
	cmd := exec.Command(kumiBin, "resize", "-s", "orders")
	cmd.Env = cleanEnv(b.env)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan(), "the follower's first line")
	require.Contains(t, lines.Text(), "switched  C = ")
	w.drain(1, bound.Limit)
	w.pass()
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	require.NoError(t, cmd.Wait())
	require.Contains(t, strings.Join(rest, "\n"), "done      generation 2, 16 buckets")
}

// After a resize a dead letter says which generation's bucket gave up on
// its event: the list shows a GEN column, JSON the generation, and a
// retired generation's letter replays by its event as any other.
func TestDeadLettersShowTheirGeneration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "order", 2, 4)
	for i, e := range evs[:3] {
		_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "shipping", Generation: i % 2, Bucket: 1,
			EventID: e.ID, Reason: "boom", Attempts: 5})
		require.NoError(t, err)
	}
	r := b.run(t, "dead-letters", "list", "-s", "shipping")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^POSITION\s+GEN\s+BUCKET\s+EVENT`, r.stdout)
	require.Regexp(t, `(?m)^`+itoa(int(evs[1].Position))+`\s+1\s+1\s+`+evs[1].ID.String(), r.stdout)
	r = b.run(t, "dead-letters", "list", "-s", "shipping", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	ls := decode[[]letterJSON](t, r.stdout)
	require.Len(t, ls, 3)
	require.Equal(t, []int{0, 1, 0}, []int{ls[0].Generation, ls[1].Generation, ls[2].Generation})

	r = b.run(t, "dead-letters", "replay", "-s", "shipping", "--event", evs[0].ID.String(), "--exec", "cat >/dev/null")
	require.Equal(t, exitOK, r.code, r.stderr)
	d, err := b.store.DeadLetter(ctx, "shipping", evs[0].ID)
	require.NoError(t, err)
	require.NotNil(t, d.ReplayedAt, "generation 0's letter replayed")
	d, err = b.store.DeadLetter(ctx, "shipping", evs[2].ID)
	require.NoError(t, err)
	require.Nil(t, d.ReplayedAt, "only the letter asked for")
}
