package migrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func migrations(t *testing.T) []migrate.Migration {
	t.Helper()
	ms, err := migrate.Load(fstest.MapFS{
		"m/0001_t.sql": {Data: []byte("CREATE TABLE {{schema}}.t (id int);")},
	}, "m")
	require.NoError(t, err)
	return ms
}

// PostgreSQL cuts identifiers at 63 bytes without a word: two long names
// sharing their first 63 bytes would share one schema (and, for the lease
// store, one bucket pool).
func TestApplyRefusesASchemaNamePostgreSQLWouldCut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	base := pgtest.NewSchema(t)
	long := base + strings.Repeat("x", migrate.MaxSchemaNameLength-len(base))
	require.NoError(t, migrate.Apply(ctx, pool, long, "test", migrations(t)), "63 bytes is fine")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+long+`" CASCADE`) })
	for _, name := range []string{long + "a", long + "b", strings.Repeat("é", 32), "", "a\x00b", "a\xffb", "pg_mine"} {
		err := migrate.Apply(ctx, pool, name, "test", migrations(t))
		var schemaErr *kumierr.ConfigError
		require.ErrorAs(t, err, &schemaErr, "%q", name)
		require.Equal(t, "test schema", schemaErr.Field)
		require.Equal(t, name, schemaErr.Value)
	}
	var schemas int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1 || '%'`, base).Scan(&schemas))
	require.Equal(t, 1, schemas, "no schema but the 63-byte one was created")
}

// An old binary under a role without CREATE, against a schema a newer
// binary migrated, must be told to upgrade, not "permission denied".
func TestApplyReportsANewerSchemaBeforeAnyDDL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.NewSchema(t)
	newer, err := migrate.Load(fstest.MapFS{
		"m/0001_t.sql": {Data: []byte("CREATE TABLE {{schema}}.t (id int);")},
		"m/0002_u.sql": {Data: []byte("CREATE TABLE {{schema}}.u (id int);")},
	}, "m")
	require.NoError(t, err)
	require.NoError(t, migrate.Apply(ctx, pool, schema, "test", newer))

	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "kumi_old_" + hex.EncodeToString(b[:])
	q, r := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		"CREATE ROLE " + r + " LOGIN",
		"GRANT USAGE ON SCHEMA " + q + " TO " + r,
		"GRANT SELECT ON " + q + ".schema_migrations TO " + r,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+r)
		_, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
	})
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	old, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(old.Close)

	err = migrate.Apply(ctx, old, schema, "test", migrations(t))
	var newerErr *kumierr.ConfigError
	require.ErrorAs(t, err, &newerErr)
	require.Equal(t, "test schema", newerErr.Field)
	require.Equal(t, schema, newerErr.Value)
	require.Equal(t, "is at version 2 of test's migrations, newer than this binary's 1: upgrade the binary", newerErr.Reason)
	// Up to date, the same role needs nothing more.
	require.NoError(t, migrate.Apply(ctx, old, schema, "test", newer))
}
