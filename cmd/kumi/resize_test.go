package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
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
		require.Empty(t, r.stdout, "no plan for a resize that moves nothing")
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

// resized makes a subscription "orders" that was resized from 8 buckets
// to 4 (generation 0 → 1) by one worker, over 40 events of category
// "order": every bucket of generation 0 checkpointed at the tenth event
// before the resize, then drained to the cut. It returns the worker and
// the cut.
func resized(t *testing.T, b *bundle) (*resizeWorker, []eventsource.RecordedEvent, int64) {
	t.Helper()
	ctx := context.Background()
	evs := b.appendEvents(t, "order", 8, 40)
	w := &resizeWorker{t: t, b: b, s: b.lease(t, "orders", "worker-a", 8)}
	for slot, l := range w.pass() {
		_, err := b.store.SaveCheckpoint(ctx, "orders", slot, evs[9].Position, w.s.Fence(slot, l.Epoch))
		require.NoError(t, err)
	}
	r := b.run(t, "resize", "-s", "orders", "--buckets", "4", "--no-wait")
	require.Equal(t, exitOK, r.code, r.stderr)
	bound := w.propose(0)
	require.True(t, bound.Decided, "the last proposal decides the cut")
	w.drain(0, bound.Limit)
	w.pass()
	rs, err := leasestore.ReadResize(ctx, b.store.Pool(), b.schema, "orders")
	require.NoError(t, err)
	require.Equal(t, leasestore.ResizeSteady, rs.State)
	require.Equal(t, 1, rs.Generation, "generation 1 serves")
	return w, evs, bound.Limit
}

// After a resize `kumi checkpoints show` shows the serving generation's
// checkpoints by bucket (not generation 1's slots as buckets 65536 and
// up), --generation a retired one's or, during a resize, the next one's,
// and refuses a generation the subscription does not have; `checkpoints
// reset --bucket B` resets the serving generation's bucket B.
func TestCheckpointsShowAGeneration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, evs, cut := resized(t, b)
	evs = append(evs, b.appendEvents(t, "order", 8, 4)...)
	l := w.pass()[eventsource.Slot(1, 2)]
	_, err := b.store.SaveCheckpoint(ctx, "orders", l.Slot, evs[43].Position, w.s.Fence(l.Slot, l.Epoch))
	require.NoError(t, err)

	r := b.run(t, "checkpoints", "show", "-s", "orders", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	cps := decode[[]checkpointJSON](t, r.stdout)
	require.Len(t, cps, 4, "generation 1's 4 buckets: %s", r.stdout)
	for i, cp := range cps {
		require.Equal(t, i, cp.Bucket)
		require.Equal(t, 1, cp.Generation)
		require.Equal(t, eventsource.Slot(1, i), cp.Slot)
		require.Equal(t, "worker-a", cp.Owner)
		want := cut
		if i == 2 {
			want = evs[43].Position
		}
		require.Equal(t, want, cp.Position, "bucket %d", i)
	}
	r = b.run(t, "checkpoints", "show", "-s", "orders", "-c", "order")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "generation 1 (serving): 4 buckets; older generations: 0 (--generation G)")
	require.Regexp(t, `(?m)^2\s+`+itoa(int(evs[43].Position))+`\s+\S+ ago\s+worker-a\s+\d+\s+0$`, r.stdout)
	require.NotRegexp(t, `(?m)^6553`, r.stdout, "a slot shown as a bucket")

	r = b.run(t, "checkpoints", "show", "-s", "orders", "--generation", "0", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	cps = decode[[]checkpointJSON](t, r.stdout)
	require.Len(t, cps, 8, "generation 0's 8 buckets: %s", r.stdout)
	for i, cp := range cps {
		require.Equal(t, i, cp.Bucket)
		require.Zero(t, cp.Generation)
		require.Equal(t, cut, cp.Position, "old bucket %d drained to the cut", i)
		require.Empty(t, cp.Owner)
	}
	r = b.run(t, "checkpoints", "show", "-s", "orders", "--generation", "0")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "generation 0 (retired; generation 1 serves): 8 buckets, drained to the cut "+itoa(int(cut)))

	for _, c := range []struct {
		gen  string
		code int
		want string
	}{
		{"2", exitUsage, `--generation 2: subscription "orders" has no generation 2 (its generations are 0 to 1)`},
		{"-1", exitUsage, "--generation -1: generations are numbered from 0"},
	} {
		r = b.run(t, "checkpoints", "show", "-s", "orders", "--generation", c.gen)
		require.Equal(t, c.code, r.code, "%s\n%s", r.stdout, r.stderr)
		require.Contains(t, r.stderr, c.want)
	}

	// During a resize the next generation is there, on standby.
	r = b.run(t, "resize", "-s", "orders", "--buckets", "6", "--no-wait")
	require.Equal(t, exitOK, r.code, r.stderr)
	w.pass()
	r = b.run(t, "checkpoints", "show", "-s", "orders", "--generation", "2", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	cps = decode[[]checkpointJSON](t, r.stdout)
	require.Len(t, cps, 6, "generation 2's 6 buckets: %s", r.stdout)
	require.Equal(t, 2, cps[5].Generation)
	require.Equal(t, "worker-a", cps[5].Owner)
	r = b.run(t, "checkpoints", "show", "-s", "orders", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Len(t, decode[[]checkpointJSON](t, r.stdout), 4, "the serving generation by default")
	r = b.run(t, "resize", "-s", "orders", "--cancel")
	require.Equal(t, exitOK, r.code, r.stderr)

	// A reset names the serving generation's bucket.
	r = b.run(t, "checkpoints", "reset", "-s", "orders", "--bucket", "2", "--position", itoa(int(cut)), "--force")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 2: checkpoint "+itoa(int(evs[43].Position))+" -> "+itoa(int(cut)))
	cp, err := b.store.Checkpoint(ctx, "orders", eventsource.Slot(1, 2))
	require.NoError(t, err)
	require.Equal(t, cut, cp)
}

// A dead letter of a retired generation — of a bucket the serving
// generation does not have — is listed (by --generation, by --bucket),
// shown with its generation, and replayed like any other.
func TestDeadLettersOfARetiredGeneration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, evs, _ := resized(t, b)
	_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "orders", Generation: 0, Bucket: 6,
		EventID: evs[6].ID, Reason: "boom", Attempts: 5})
	require.NoError(t, err)
	_, err = b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "orders", Generation: 1, Bucket: 2,
		EventID: evs[30].ID, Reason: "boom", Attempts: 5})
	require.NoError(t, err)

	r := b.run(t, "dead-letters", "list", "-s", "orders")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^`+itoa(int(evs[6].Position))+`\s+0\s+6\s+`+evs[6].ID.String(), r.stdout)
	require.Regexp(t, `(?m)^`+itoa(int(evs[30].Position))+`\s+1\s+2\s+`+evs[30].ID.String(), r.stdout)
	for _, args := range [][]string{{"--bucket", "6"}, {"--generation", "0"}, {"--generation", "0", "--bucket", "6"}} {
		r = b.run(t, append([]string{"dead-letters", "list", "-s", "orders", "--json"}, args...)...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		ls := decode[[]letterJSON](t, r.stdout)
		require.Len(t, ls, 1, "%v", args)
		require.Equal(t, evs[6].ID, ls[0].EventID, "%v", args)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--generation", "2"}, `--generation 2: subscription "orders" has no generation 2 (its generations are 0 to 1)`},
		{[]string{"--generation", "1", "--bucket", "6"}, `--bucket 6: generation 1 of subscription "orders" has buckets 0 to 3`},
		{[]string{"--bucket", "8"}, `--bucket 8: no generation of subscription "orders" has more than 8 buckets (0 to 7)`},
	} {
		r = b.run(t, append([]string{"dead-letters", "list", "-s", "orders"}, c.args...)...)
		require.Equal(t, exitUsage, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want)
	}
	r = b.run(t, "dead-letters", "show", "-s", "orders", evs[6].ID.String())
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^generation\s+0 \(retired\)$`, r.stdout)

	out := filepath.Join(t.TempDir(), "replayed")
	r = b.run(t, "dead-letters", "replay", "-s", "orders", "--generation", "0", "--exec", "cat >> "+out)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `replayed 1 dead letter(s) of "orders"`)
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Contains(t, string(got), evs[6].ID.String(), "the retired generation's event was handed to --exec")
	d, err := b.store.DeadLetter(ctx, "orders", evs[6].ID)
	require.NoError(t, err)
	require.NotNil(t, d.ReplayedAt)
	d, err = b.store.DeadLetter(ctx, "orders", evs[30].ID)
	require.NoError(t, err)
	require.Nil(t, d.ReplayedAt, "generation 1's letter was not selected")
}

// After a resize `kumi relinquish --bucket B` asks for the serving
// generation's bucket B (its slot), not generation 0's.
func TestRelinquishAfterAResize(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w, _, _ := resized(t, b)
	held := w.pass()[eventsource.Slot(1, 2)]
	b.lease(t, "orders", "worker-b", 4) // joined, no pass yet: the least loaded
	r := b.run(t, "relinquish", "-s", "orders", "--bucket", "2")
	require.Equal(t, exitOK, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stdout, "asked worker-a to hand bucket 2 (epoch "+itoa(int(held.Epoch))+") over to worker-b")
	snap, err := leasestore.ReadSnapshot(ctx, b.store.Pool(), b.schema, "orders")
	require.NoError(t, err)
	for _, s := range snap.Buckets {
		want := ""
		if s.Slot == eventsource.Slot(1, 2) {
			want = "worker-b"
		}
		require.Equal(t, want, s.ClaimWorker, "slot %d", s.Slot)
	}
}

// The first progress line of a waiting resize read "sealing proposals 0/0":
// the request's answer carries no buckets yet (issue 30).
func TestResizeProgressCountsOutOfTheBucketCounts(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	printProgress(&out, leasestore.Resize{State: leasestore.ResizeSealing, Buckets: 4, NextBuckets: 8})
	require.Contains(t, out.String(), "sealing   proposals 0/4")
	out.Reset()
	printProgress(&out, leasestore.Resize{State: leasestore.ResizeSwitched, Buckets: 4, NextBuckets: 8, Cut: 9})
	require.Contains(t, out.String(), "switched  C = 9, old drained 0/4, new ready 0/8")
}
