package migrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/internal/pgtest"
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
		var schemaErr *migrate.SchemaError
		require.ErrorAs(t, err, &schemaErr, "%q", name)
		require.Equal(t, name, schemaErr.Schema)
		var cfg interface{ ConfigError() bool }
		require.True(t, errors.As(err, &cfg) && cfg.ConfigError(), "a configuration error")
	}
	var schemas int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1 || '%'`, base).Scan(&schemas))
	require.Equal(t, 1, schemas, "no schema but the 63-byte one was created")
}
