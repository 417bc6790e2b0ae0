package leasestore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// Migration 0003 on a schema with data: the constraint it drops is 0001's
// slot bound, existing subscriptions become generation 0 with their N, and
// the previous version's statements still work on them.
func TestMigrationGenerations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &testBundle{pool: pgtest.Pool(t), schema: pgtest.NewSchema(t), sub: "orders"}
	ms, err := migrate.Load(migrationsFS, "migrations")
	require.NoError(t, err)
	require.Equal(t, "0003_generations.sql", ms[2].Name)
	require.NoError(t, migrate.Apply(ctx, b.pool, b.schema, "leasestore", ms[:2]))
	constraint := func(name string) string {
		var def string
		err := b.pool.QueryRow(ctx, "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2",
			b.table("lease_buckets"), name).Scan(&def)
		if err != nil {
			require.ErrorIs(t, err, pgx.ErrNoRows)
		}
		return def
	}
	require.Equal(t, "CHECK (((bucket_count > 0) AND (bucket >= 0) AND (bucket < bucket_count)))", constraint("lease_buckets_check"),
		"the constraint 0003 drops is 0001's bound on buckets")

	// Version 2's workers at work: two subscriptions, one of them held.
	p1 := newProtocolOne(b.pool, b.schema, "orders", "older", 3, 30*time.Second, nil)
	_, err = b.pool.Exec(ctx, "INSERT INTO "+b.table("lease_buckets")+" (subscription, bucket, bucket_count) "+
		"SELECT 'orders', g, 3 FROM generate_series(0, 2) g UNION ALL SELECT 'billing', g, 2 FROM generate_series(0, 1) g")
	require.NoError(t, err)
	held, err := p1.pass(ctx)
	require.NoError(t, err)
	require.Len(t, held, 3)

	require.NoError(t, Migrate(ctx, b.pool, b.schema))
	require.Empty(t, constraint("lease_buckets_check"))
	require.Contains(t, constraint("lease_buckets_slot"), "bucket / 65536")

	rows, _ := b.pool.Query(ctx, "SELECT s.subscription, s.generation, s.bucket_count, s.state, g.start_after FROM "+
		b.table("subscriptions")+" s JOIN "+b.table("generations")+" g USING (subscription, generation) ORDER BY 1")
	type sub struct {
		Name       string
		Gen, N     int
		State      string
		StartAfter int64
	}
	subs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[sub])
	require.NoError(t, err)
	require.Equal(t, []sub{{"billing", 0, 2, "steady", 0}, {"orders", 0, 3, "steady", 0}}, subs)

	// The previous version goes on: heartbeat, renew, claim, fence.
	held, err = p1.pass(ctx)
	require.NoError(t, err, "a subscription never resized: the older worker is not fenced out")
	require.Len(t, held, 3)
	owner, epoch, err := p1.guard(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, "older", owner)
	require.EqualValues(t, 1, epoch)

	// And this version adopts the subscription, whatever its Buckets.
	cur := b.open(t, b.config(KindRow, 8, "current"))
	res := pass(t, cur)
	require.Equal(t, 3, res.Resize.Buckets)
	require.Equal(t, 2, res.Live)
}

// Migration 0003's trigger takes its schema from TG_TABLE_SCHEMA: schemas
// whose names are SQL, dollar quotes included, migrate, resize and fence
// out a protocol-1 worker like any other.
func TestMigrationGenerationsHostileSchemaNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	canary := pgtest.NewSchema(t)
	_, err := pgtest.Pool(t).Exec(ctx, "CREATE SCHEMA "+canary+"; CREATE TABLE "+canary+".y (id int)")
	require.NoError(t, err)
	suffix := canary[len(canary)-6:]
	for _, schema := range []string{
		`x"; DROP TABLE ` + canary + `.y; --` + suffix,
		`a$$b'c;` + suffix,
		`q$fn$z` + suffix,
		`{{schema}}` + suffix,
	} {
		t.Run(schema, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			t.Cleanup(func() {
				_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			})
			b := &testBundle{pool: pool, schema: schema, sub: "orders"}
			require.NoError(t, Migrate(ctx, pool, schema))
			require.NoError(t, Migrate(ctx, pool, schema))
			es, err := eventsource.New(pool, eventsource.Config{Schema: schema})
			require.NoError(t, err)
			require.NoError(t, es.Migrate(ctx))
			require.NoError(t, es.EnsureConsumerGroupIndex(ctx, 3))
			s := b.open(t, b.config(KindRow, 2, "w"))
			require.Len(t, pass(t, s).Owned, 2)
			p1 := newProtocolOne(pool, schema, b.sub, "older", 2, 30*time.Second, nil)
			require.NoError(t, p1.heartbeat(ctx))
			_, err = RequestResize(ctx, pool, schema, ResizeRequest{Subscription: b.sub, Buckets: 3, EvictOldWorkers: true})
			require.NoError(t, err)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, p1.heartbeat(ctx), &pgErr)
			require.Equal(t, "KU001", pgErr.Code)
			require.Len(t, pass(t, s).Owned, 4, "its 2 buckets, and its share of the 3 new ones (the evicted worker still counts as live)")

			var exists bool
			require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", canary+".y").Scan(&exists))
			require.True(t, exists, "the canary table survived")
		})
	}
}
