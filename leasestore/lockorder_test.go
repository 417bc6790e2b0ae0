package leasestore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// An owner's renew locks its rows in bucket order; a claimant placing
// claims on them must lock in the same order, or each can hold a row the
// other waits for: a deadlock, which PostgreSQL breaks by failing one of
// the two — often the owner's pass, so its leases go unrenewed.
func TestPlacingClaimsLocksInTheRenewsOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.open(t, b.config(KindRow, 2, "a"))
	require.Len(t, pass(t, a).Owned, 2)
	_ = b.open(t, b.config(KindRow, 2, "b")) // a live worker to claim for

	// The owner's renew, mid-way: it holds bucket 0 and will want bucket 1.
	renew, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = renew.Rollback(ctx) }()
	lockRow := "SELECT bucket FROM " + pgx.Identifier{b.schema}.Sanitize() + ".lease_buckets WHERE subscription = $1 AND bucket = $2 FOR UPDATE"
	_, err = renew.Exec(ctx, lockRow, b.sub, 0)
	require.NoError(t, err)

	// The claimant places claims on both of a's buckets.
	place, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = place.Rollback(ctx) }()
	var placePID int32
	require.NoError(t, place.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&placePID))
	placed := make(chan error, 1)
	go func() {
		rows, err := place.Query(ctx, a.st.get("place_claims"), b.sub, "b", []string{"a"}, []int32{2}, 0)
		if err == nil {
			_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (int32, error) {
				var bucket int32
				var owner string
				err := r.Scan(&bucket, &owner)
				return bucket, err
			})
		}
		placed <- err
	}()
	pgtest.Eventually(t, 10*time.Second, func() bool {
		var waiting bool
		err := pgtest.Pool(t).QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)", placePID).Scan(&waiting)
		return err == nil && waiting
	}, "the claimant waits for the owner's row")

	// The renew goes on to bucket 1: it must not find it held by the
	// claimant, who waits for bucket 0.
	_, err = renew.Exec(ctx, lockRow, b.sub, 1)
	require.NoError(t, err, "the owner's renew deadlocked with the claimant's placement")
	require.NoError(t, renew.Commit(ctx))
	require.NoError(t, <-placed, "the claimant's placement deadlocked with the owner's renew")
	require.NoError(t, place.Commit(ctx))
}

// A fenced write that finds its bucket taken marks it in the view, which a
// pass has just made: the pass must be done with the map before it lets
// others reach it (a data race the race detector caught in the fault
// suite). Here the Guard learns of the pass only through the view, as a
// reader's checkpoint write does.
func TestAFailedFenceAndAPassDoNotRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.open(t, b.config(KindRow, 4, "a"))
	pass(t, a)
	for range 5 {
		held := a.Held()[0]
		passed := make(chan struct{})
		go func() {
			defer close(passed)
			_, _ = a.Pass(ctx) // renews bucket 0 at its epoch
		}()
		pgtest.Eventually(t, 10*time.Second, func() bool { return a.Held()[0].Expires.After(held.Expires) },
			"the pass renewed bucket 0")
		// An operator fences every earlier holder out: a's fenced write of
		// bucket 0 at its epoch fails, and marks the pass's view.
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := FenceOut(ctx, tx, b.schema, b.sub, 0, true)
			return err
		}))
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return a.Guard(ctx, tx, 0, held.Epoch) })
		require.ErrorIs(t, err, eventsource.ErrFenceLost)
		<-passed
		pass(t, a) // takes bucket 0 back at its new epoch
	}
}
