package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

func TestCheckpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "account", 8, 20)
	a := b.lease(t, "balances", "worker-a", 4)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	for _, l := range res.Owned {
		_, err := b.store.SaveCheckpoint(ctx, "balances", l.Bucket, evs[19].Position, a.Fence(l.Bucket, l.Epoch))
		require.NoError(t, err)
	}

	r := b.run(t, "checkpoints", "show", "-s", "balances", "-c", "account")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^2\s+20\s+\S+ ago\s+worker-a\s+1\s+0$`, r.stdout)

	// Refused while worker-a holds the bucket, naming the owner.
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "2", "--position", "0")
	require.Equal(t, exitRuntime, r.code, r.stdout)
	require.Contains(t, r.stderr, "bucket 2 is held by worker-a (epoch 1")
	require.Contains(t, r.stderr, "--force")
	cp, err := b.store.Checkpoint(ctx, "balances", 2)
	require.NoError(t, err)
	require.Equal(t, evs[19].Position, cp)

	// --force resets it anyway, with a warning.
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "2", "--position", "5", "--force")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 2: checkpoint 20 -> 5")
	require.Contains(t, r.stderr, "warning: bucket 2 is held by worker-a")
	cp, err = b.store.Checkpoint(ctx, "balances", 2)
	require.NoError(t, err)
	require.EqualValues(t, 5, cp)
	// ... and the owner is fenced out: its in-memory position cannot undo it.
	_, err = b.store.SaveCheckpoint(ctx, "balances", 2, evs[19].Position, a.Fence(2, 1))
	require.ErrorIs(t, err, eventsource.ErrFenceLost)

	// A position past the head is refused unless asked for.
	past := strconv.FormatInt(evs[19].Position+1, 10)
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "2", "--position", past, "--force")
	require.Equal(t, exitUsage, r.code, r.stdout)
	require.Contains(t, r.stderr, "past the store's head ("+strconv.FormatInt(evs[19].Position, 10)+")")
	require.Contains(t, r.stderr, "--beyond-head")
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "2", "--position", past, "--force", "--beyond-head")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 2: checkpoint 5 -> "+past)

	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "4", "--position", "0")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "has buckets 0 to 3")

	// Once the owner has left, every bucket resets, backwards.
	require.NoError(t, a.Leave(ctx))
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--all-buckets", "--position", "0")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 3: checkpoint 20 -> 0")
	r = b.run(t, "checkpoints", "show", "-s", "balances", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	cps := decode[[]checkpointJSON](t, r.stdout)
	require.Len(t, cps, 4)
	for _, c := range cps {
		require.Zero(t, c.Position)
		require.Empty(t, c.Owner)
	}
}

// The owner's passes stop past its TTL and nobody claims its bucket; the
// operator resets; the owner comes back: its next checkpoint write, from
// its in-memory position, must not undo the reset.
func TestCheckpointResetOnALapsedLeaseIsNotUndoneByItsOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "account", 2, 20)
	a, err := leasestore.New(b.store.Pool(), leasestore.Config{Schema: b.schema, Subscription: "balances",
		Worker: "worker-a", Buckets: 1, LeaseOptions: leasestore.LeaseOptions{NoListen: true, TTL: 600 * time.Millisecond, Heartbeat: 250 * time.Millisecond, Margin: 200 * time.Millisecond},
	})
	if err == nil {
		err = a.Start(ctx)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	l := res.Claimed[0]
	_, err = b.store.SaveCheckpoint(ctx, "balances", 0, evs[9].Position, a.Fence(0, l.Epoch))
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		snap, err := a.Snapshot(ctx)
		require.NoError(t, err)
		return !snap.Buckets[0].Held(snap.Now)
	}, "the lease never lapsed")

	r := b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "0", "--position", "0")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 0: checkpoint "+strconv.FormatInt(evs[9].Position, 10)+" -> 0")
	require.Contains(t, r.stdout, "earlier holders fenced out (epoch 1 -> 2)")

	// The owner recovers and writes from where its reader was.
	_, err = b.store.SaveCheckpoint(ctx, "balances", 0, evs[19].Position, a.Fence(0, l.Epoch))
	require.ErrorIs(t, err, eventsource.ErrFenceLost)
	cp, err := b.store.Checkpoint(ctx, "balances", 0)
	require.NoError(t, err)
	require.Zero(t, cp, "the reset stands")
	res, err = a.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0}, res.Lost, "its reader stops, and restarts at the new epoch from the reset")
	require.EqualValues(t, 2, res.Claimed[0].Epoch)
}
