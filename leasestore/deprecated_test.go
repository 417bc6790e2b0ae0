package leasestore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// The former names ("shard" for a bucket, "member" for a worker) still
// compile and mean what the new ones do.
func TestDeprecatedNamesMeanTheNewOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Pool(t), pgtest.NewSchema(t)
	require.NoError(t, leasestore.Migrate(ctx, pool, schema))
	open := func(worker string, n int) *leasestore.Store {
		s, err := leasestore.New(ctx, pool, leasestore.Config{Schema: schema, Subscription: "orders", Worker: worker, Buckets: n, NoListen: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}

	a := open("a", 4)
	require.NoError(t, a.EnsureShards(ctx))
	_, err := a.Pass(ctx)
	require.NoError(t, err)
	// Since resizes the database's count rules: nothing returns the
	// mismatch error any more; its former names still name the type.
	require.NoError(t, open("b", 8).EnsureShards(ctx))
	var err2 error = &leasestore.BucketCountMismatchError{Subscription: "orders", Configured: 8, Found: 4}
	var former *leasestore.ShardCountMismatchError
	require.ErrorAs(t, err2, &former)
	var older *leasestore.ShardCountMismatch
	require.ErrorAs(t, err2, &older)
	require.Equal(t, 4, former.Found)

	snap, err := leasestore.ReadSnapshot(ctx, pool, schema, "orders")
	require.NoError(t, err)
	require.Len(t, snap.Workers, 2)
	require.Equal(t, snap.Workers, snap.Members)
	var w leasestore.Member = snap.Workers[0]
	require.Equal(t, "a", w.Worker)
	for _, b := range snap.Buckets {
		require.Equal(t, 4, b.BucketCount)
		require.Equal(t, b.BucketCount, b.ShardCount)
	}
	subs, err := leasestore.ListSubscriptions(ctx, pool, schema)
	require.NoError(t, err)
	require.Len(t, subs, 1)
	require.Equal(t, 2, subs[0].LiveWorkers)
	require.Equal(t, subs[0].LiveWorkers, subs[0].Members)
}
