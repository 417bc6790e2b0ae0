package leasestore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// Migration 0002 leaves no table, column, constraint or index of the lease
// store named for a "member" or a "shard": workers and buckets.
func TestTheLeaseSchemaSaysWorkerAndBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	rows, err := b.pool.Query(ctx, `
SELECT 'relation ' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || co.conname FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace WHERE n.nspname = $1`, b.schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, names, "relation lease_workers")
	require.Contains(t, names, "column lease_buckets.bucket_count")
	for _, name := range names {
		require.NotRegexp(t, `(?i)member|shard`, name)
	}
}

// An older kumi worker, still running when a newer one applies migration
// 0002, fails every pass (its statements name lease_members and
// shard_count): it renews nothing, and once its leases lapse a current
// worker takes them at a new epoch, which fences the older one's writes
// out. Restarted, the older binary refuses the newer schema.
func TestAnOlderWorkerHoldsNothingOnceTheSchemaIsRenamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &testBundle{pool: pgtest.Pool(t), schema: pgtest.NewSchema(t), sub: "orders"}
	ms, err := migrate.Load(migrationsFS, "migrations")
	require.NoError(t, err)
	require.NoError(t, migrate.Apply(ctx, b.pool, b.schema, "leasestore", ms[:1]))

	// The older binary's statements: protocol 1's in 0001's words.
	const ttl = 2 * time.Second
	older := newProtocolOne(b.pool, b.schema, b.sub, "old", 4, ttl,
		strings.NewReplacer("lease_workers", "lease_members", "bucket_count", "shard_count"))
	_, err = b.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{b.schema, "lease_buckets"}.Sanitize()+
		" (subscription, bucket, shard_count) SELECT $1, g, 4 FROM generate_series(0, 3) g", b.sub)
	require.NoError(t, err)
	held, err := older.pass(ctx)
	require.NoError(t, err)
	require.Len(t, held, 4, "on its own schema the older worker holds every bucket")

	require.NoError(t, Migrate(ctx, b.pool, b.schema))

	_, err = older.pass(ctx)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "42P01", pgErr.Code, "undefined table: %v", err)

	cfg := b.config(KindRow, 4, "new")
	cfg.TTL, cfg.Heartbeat, cfg.Margin, cfg.NoListen = ttl, 500*time.Millisecond, 500*time.Millisecond, true
	current := b.open(t, cfg)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		res, err := current.Pass(ctx)
		return err == nil && len(res.Owned) == 4
	}, "the current worker takes the lapsed buckets")
	for _, l := range current.Held() {
		require.Equal(t, int64(2), l.Epoch, "bucket %d at a new epoch", l.Bucket)
	}
	owner, epoch, err := older.guard(ctx, 0)
	require.NoError(t, err)
	require.NotEqual(t, [2]any{"old", int64(1)}, [2]any{owner, epoch}, "its holding is fenced out")

	var newer *kumierr.ConfigError
	require.ErrorAs(t, migrate.Apply(ctx, b.pool, b.schema, "leasestore", ms[:1]), &newer,
		"the older binary refuses to start on the newer schema")
	require.Contains(t, newer.Reason, "upgrade the binary")
}

// A rename keeps a table's grants: a least-privilege worker role granted
// on lease_members before migration 0002 works on lease_workers after it.
func TestGrantsOnTheWorkersTableSurviveItsRename(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &testBundle{pool: pgtest.Pool(t), schema: pgtest.NewSchema(t), sub: "orders"}
	ms, err := migrate.Load(migrationsFS, "migrations")
	require.NoError(t, err)
	require.NoError(t, migrate.Apply(ctx, b.pool, b.schema, "leasestore", ms[:1]))
	role := leastPrivilegeRoleOn(t, b, "lease_members")
	require.NoError(t, Migrate(ctx, b.pool, b.schema))
	grantResizeTables(t, b, role) // new tables need their grants (docs/operations.md, roles)

	s := openOn(t, rolePool(t, role), b.config(KindRow, 2, "w"))
	require.Len(t, pass(t, s).Owned, 2)
	require.NoError(t, s.Leave(ctx), "a leave deletes its lease_workers row")
}

// Both migrations, and a pass over the renamed tables, run in schemas whose
// names are SQL: every identifier is quoted, so they are just names.
func TestHostileSchemaNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	canary := pgtest.NewSchema(t)
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+canary+"; CREATE TABLE "+canary+".y (id int)")
	require.NoError(t, err)
	suffix := canary[len(canary)-6:]
	for _, schema := range []string{
		`x"; DROP TABLE ` + canary + `.y; --` + suffix,
		`a$$b'c;` + suffix,
		`Mixed Case "Ünï" ` + suffix,
		`{{schema}}` + suffix,
	} {
		t.Run(schema, func(t *testing.T) {
			t.Parallel()
			t.Cleanup(func() {
				_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			})
			require.NoError(t, Migrate(ctx, pool, schema))
			require.NoError(t, Migrate(ctx, pool, schema))
			b := &testBundle{pool: pool, schema: schema, sub: "orders"}
			s := b.open(t, b.config(KindRow, 2, "w"))
			require.Len(t, pass(t, s).Owned, 2)
			snap, err := s.Snapshot(ctx)
			require.NoError(t, err)
			require.Len(t, snap.Workers, 1)

			var exists bool
			require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", canary+".y").Scan(&exists))
			require.True(t, exists, "the canary table survived")
		})
	}
}
