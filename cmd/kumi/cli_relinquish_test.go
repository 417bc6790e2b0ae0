package main

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/admin"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

func TestRelinquish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	a := b.lease(t, "balances", "worker-a", 4)
	// worker-b joined (New registers it) but has run no pass: worker-a
	// takes its fair share of two, and worker-b is the least loaded.
	bw := b.lease(t, "balances", "worker-b", 4)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, 2)
	bucket, epoch := res.Owned[0].Bucket, res.Owned[0].Epoch
	free := -1
	for i := range 4 {
		if !slices.ContainsFunc(res.Owned, func(l leasestore.Lease) bool { return l.Bucket == i }) {
			free = i
			break
		}
	}

	t.Run("RefusesAFreeBucket", func(t *testing.T) {
		r := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(free))
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, "has no owner")
	})
	t.Run("RefusesATargetThatIsNotAWorker", func(t *testing.T) {
		r := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(bucket), "--to", "ghost")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "--to ghost: not a live worker")
	})
	t.Run("RefusesTheOwnerAsTarget", func(t *testing.T) {
		r := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(bucket), "--to", "worker-a")
		require.Equal(t, exitUsage, r.code)
	})

	// Ask, and wait in the background while the two workers run their passes.
	cmd := exec.Command(kumiBin, "relinquish", "-s", "balances", "--bucket", itoa(bucket), "--wait", "30s")
	cmd.Env = cleanEnv(b.env)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	pgtest.Eventually(t, 20*time.Second, func() bool {
		var claim string
		_ = b.store.Pool().QueryRow(ctx, `SELECT coalesce(claim_worker, '') FROM `+b.store.QuotedSchema()+
			`.lease_buckets WHERE subscription = 'balances' AND bucket = $1`, bucket).Scan(&claim)
		return claim == "worker-b"
	}, "the claim for worker-b is placed")

	again := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(bucket))
	require.Equal(t, exitRuntime, again.code)
	require.Contains(t, again.stderr, "already has a pending claim by worker-b")

	// The owner's next pass sees the claim: it drains and hands over.
	res, err = a.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{bucket}, res.HandOff)
	require.NoError(t, a.HandOver(ctx, bucket))
	// The claimant activates it at the next epoch.
	resB, err := bw.Pass(ctx)
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(resB.Claimed, func(l leasestore.Lease) bool {
		return l.Bucket == bucket && l.Epoch == epoch+1
	}), "claimed: %+v", resB.Claimed)

	require.NoError(t, cmd.Wait(), out.String())
	// Short and structured: a line each, the request, what comes next,
	// what happened (then any other bucket that moved meanwhile).
	require.True(t, strings.HasPrefix(out.String(), "asked worker-a to hand bucket "+itoa(bucket)+" (epoch 1) over to worker-b\n"+
		"next: the owner hands it over on its next pass; worker-b (then 1 of its fair share 2) takes it on its own\n"+
		"bucket "+itoa(bucket)+" is now held by worker-b at epoch 2\n"), out.String())

	t.Run("HistorySaysWhoAskedAndWhatMoved", func(t *testing.T) {
		r := b.run(t, "status", "-s", "balances", "--history", "--bucket", itoa(bucket), "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		changes := decode[[]leasestore.OwnershipChange](t, r.stdout)
		kinds := make([]string, len(changes))
		for i, c := range changes {
			kinds[i] = c.Kind
		}
		// Newest first: the handoff, the release, the request, the claim;
		// the joins of the pool (no bucket) among them.
		var story []string
		for _, c := range changes {
			if c.Bucket >= 0 {
				story = append(story, c.Kind+" "+c.From+"->"+c.To)
			}
		}
		require.Equal(t, []string{"handoff worker-a->worker-b", "release worker-a->", "request worker-a->worker-b",
			"claim ->worker-a"}, story, "%v", kinds)
		for _, c := range changes {
			if c.Kind == "request" {
				require.Equal(t, "kumi relinquish", c.Application, "the operator's command, by name")
			}
		}
		r = b.run(t, "status", "-s", "balances", "--history", "--bucket", itoa(bucket), "--limit", "3")
		require.Equal(t, exitOK, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 5, "a title, a header and three changes:\n%s", r.stdout)
		require.Contains(t, lines[1], "TIME")
		require.Contains(t, lines[2], "handoff")
		require.Contains(t, lines[2], "worker-b had claimed it at ")

		r = b.run(t, "status", "-s", "balances", "--bucket", "1")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "need --history")
		r = b.run(t, "status", "--history")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "--history needs --subscription")
	})

	t.Run("RefusesWhenNobodyElseIsLive", func(t *testing.T) {
		require.NoError(t, bw.Leave(ctx))
		_, err := a.Pass(ctx)
		require.NoError(t, err)
		own := a.Held()[0].Bucket
		r := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(own))
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, "worker-a is the only live worker")
	})
}

// relinquishAtShare sets up worker-a and worker-b holding two of four
// buckets each, starts `kumi relinquish --wait` on one of worker-a's
// buckets (whose claimant, worker-b, is then at its share) and waits until
// the claim is placed. It returns the workers, the bucket and the command.
func relinquishAtShare(t *testing.T) (b *bundle, a, bw *leasestore.Store, bucket int, wait func() string) {
	t.Helper()
	ctx := context.Background()
	b = setup(t)
	a = b.lease(t, "balances", "worker-a", 4)
	bw = b.lease(t, "balances", "worker-b", 4)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, 2)
	resB, err := bw.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, resB.Owned, 2)
	bucket = res.Owned[0].Bucket
	cmd := exec.Command(kumiBin, "relinquish", "-s", "balances", "--bucket", itoa(bucket), "--wait", "60s", "-v")
	cmd.Env = cleanEnv(b.env)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	pgtest.Eventually(t, 20*time.Second, func() bool {
		var claim string
		_ = b.store.Pool().QueryRow(ctx, `SELECT coalesce(claim_worker, '') FROM `+b.store.QuotedSchema()+
			`.lease_buckets WHERE subscription = 'balances' AND bucket = $1`, bucket).Scan(&claim)
		return claim == "worker-b"
	}, "the claim for worker-b is placed")
	return b, a, bw, bucket, func() string {
		require.NoError(t, cmd.Wait(), out.String())
		return out.String()
	}
}

// relinquish to a worker already at its fair share said "it will withdraw
// the claim", then the claimant kept the bucket while another moved: it
// says what each order of passes leads to, and reports what happened
// (issue 15).
func TestRelinquishToAWorkerAtItsShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const predicted = "note: worker-b is at its fair share already (2 of ceil(4/2) = 2), so this claim puts it above: "
	t.Run("ClaimantPassesFirstAndWithdraws", func(t *testing.T) {
		t.Parallel()
		_, a, bw, bucket, wait := relinquishAtShare(t)
		_, err := bw.Pass(ctx)
		require.NoError(t, err)
		res, err := a.Pass(ctx)
		require.NoError(t, err)
		require.Empty(t, res.HandOff)
		out := wait()
		require.Contains(t, out, predicted)
		require.Contains(t, out, "worker-b withdraws the claim and worker-a keeps bucket "+itoa(bucket))
		require.Contains(t, out, "the claim was withdrawn: worker-a still holds bucket "+itoa(bucket)+" at epoch 1")
		require.NotContains(t, out, "meanwhile")
	})
	t.Run("OwnerPassesFirstAndTheyTrade", func(t *testing.T) {
		t.Parallel()
		_, a, bw, bucket, wait := relinquishAtShare(t)
		res, err := a.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, []int{bucket}, res.HandOff)
		require.Len(t, res.Requested, 1, "worker-a, below its share, claims one of worker-b's buckets: %+v", res)
		other := res.Requested[0].Bucket
		require.NoError(t, a.HandOver(ctx, bucket))
		resB, err := bw.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, []int{other}, resB.HandOff)
		require.NoError(t, bw.HandOver(ctx, other))
		_, err = a.Pass(ctx)
		require.NoError(t, err)
		out := wait()
		require.Contains(t, out, predicted)
		require.Contains(t, out, "worker-b takes bucket "+itoa(bucket)+" and gives another bucket to worker-a")
		require.Contains(t, out, "bucket "+itoa(bucket)+" is now held by worker-b at epoch 2")
		require.Contains(t, out, "meanwhile bucket "+itoa(other)+" moved from worker-b to worker-a (epoch 2)")
	})
}

// relinquish printed a 900-character paragraph naming the two workers nine
// times (issue 30): without -v it is a line, each worker named once.
func TestRelinquishIsShortWithoutVerbose(t *testing.T) {
	t.Parallel()
	owner, target := uuid.NewString(), uuid.NewString()
	h := admin.Handoff{Bucket: 3, Slot: 3, HandoffRequest: leasestore.HandoffRequest{Owner: owner, To: target, Buckets: 4, Live: 2, Load: 2},
		Loads: map[string]int{owner: 2, target: 2}, Load: 2, Share: 2, AboveShare: true}
	short := predict(h, false)
	require.Len(t, short, 1)
	require.Less(t, len(short[0]), 200, short[0])
	require.Equal(t, 1, strings.Count(short[0], target), short[0])
	require.NotContains(t, short[0], owner, short[0])
	long := predict(h, true)
	require.Greater(t, len(long), 1, "-v explains")
	for _, l := range long {
		require.Less(t, len(l), 240, "one line each: %s", l)
	}
}
