package leasestore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
)

// The operator's reads (the CLI, the console) see what a worker's Snapshot
// sees, and join nothing: the workers and their fair shares stay as they
// were.
func TestOperatorReadsJoinNothing(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setup(t)
		a := b.open(t, b.config(kind, 4, "a"))
		c := b.open(t, b.config(kind, 4, "c"))
		for i := 0; ; i++ { // converge to 2 buckets each
			res := round(t, []*Store{a, c})
			if len(res[0].Owned) == 2 && len(res[1].Owned) == 2 {
				break
			}
			require.Less(t, i, 20, "the two workers never settled at 2 buckets each")
		}

		want, err := a.Snapshot(ctx)
		require.NoError(t, err)
		require.Len(t, want.Workers, 2)
		got, err := ReadSnapshot(ctx, b.pool, b.schema, b.sub)
		require.NoError(t, err)
		require.Equal(t, want.Buckets, got.Buckets)
		require.Equal(t, want.Workers, got.Workers, "the observer is not a worker")
		require.Equal(t, b.sub, got.Subscription)

		// In the caller's repeatable-read transaction: Now is its clock.
		err = pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
			func(tx pgx.Tx) error {
				snap, err := ReadSnapshotTx(ctx, tx, b.schema, b.sub)
				require.NoError(t, err)
				var now time.Time
				require.NoError(t, tx.QueryRow(ctx, "SELECT now()").Scan(&now))
				require.True(t, now.Equal(snap.Now))
				require.Equal(t, want.Buckets, snap.Buckets)
				return nil
			})
		require.NoError(t, err)

		// A subscription without lease rows: empty, with the database's clock.
		snap, err := ReadSnapshot(ctx, b.pool, b.schema, "nobody")
		require.NoError(t, err)
		require.Empty(t, snap.Buckets)
		require.Empty(t, snap.Workers)
		require.False(t, snap.Now.IsZero())

		// Nothing joined: a's and c's passes keep their shares of 2.
		res := round(t, []*Store{a, c})
		for _, r := range res {
			require.Empty(t, r.Lost)
			require.Len(t, r.Owned, 2)
		}
	})
}

func TestListSubscriptionsAndBucketCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.open(t, b.config(KindRow, 4, "a"))
	pass(t, a)
	other := b.config(KindRow, 3, "x")
	other.Subscription = "billing"
	x := b.open(t, other)
	y := b.open(t, func() Config { c := other; c.Worker = "y"; return c }())
	pass(t, x) // takes the 3 buckets
	pass(t, y) // joins; its claims wait for x's handover

	type brief struct {
		sub                 string
		buckets, held, live int
	}
	briefs := func(ls []SubscriptionLeases) []brief {
		out := make([]brief, len(ls))
		for i, l := range ls {
			out[i] = brief{l.Subscription, l.Buckets, l.Held, l.LiveWorkers}
		}
		return out
	}
	want := []brief{{"billing", 3, 3, 2}, {"orders", 4, 4, 1}}
	got, err := ListSubscriptions(ctx, b.pool, b.schema)
	require.NoError(t, err)
	require.Equal(t, want, briefs(got))
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		got, err = ListSubscriptionsTx(ctx, tx, b.schema)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, want, briefs(got))

	for sub, n := range map[string]int{"orders": 4, "billing": 3, "nobody": 0} {
		got, err := BucketCount(ctx, b.pool, b.schema, sub)
		require.NoError(t, err)
		require.Equal(t, n, got, sub)
	}

	var cfgErr *kumierr.ConfigError
	_, err = BucketCount(ctx, b.pool, "", "orders")
	require.ErrorAs(t, err, &cfgErr)
	require.Equal(t, "leasestore schema", cfgErr.Field)
	_, err = ListSubscriptions(ctx, b.pool, "")
	require.ErrorAs(t, err, &cfgErr)
	_, err = ReadSnapshot(ctx, b.pool, b.schema, "")
	require.ErrorIs(t, err, eventsource.ErrInvalidName)
	_, err = BucketCount(ctx, b.pool, b.schema, "bad\x00name")
	require.ErrorIs(t, err, eventsource.ErrInvalidName)
}
