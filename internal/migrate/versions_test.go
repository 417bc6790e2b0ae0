package migrate_test

import (
	"context"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestSchemaExistsAndVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.NewSchema(t)

	exists, err := migrate.SchemaExists(ctx, pool, schema)
	require.NoError(t, err)
	require.False(t, exists)
	vs, err := migrate.Versions(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, vs, "no schema, no versions")

	two, err := migrate.Load(fstest.MapFS{
		"m/0001_a.sql": {Data: []byte("CREATE TABLE {{schema}}.a (id int);")},
		"m/0002_b.sql": {Data: []byte("CREATE TABLE {{schema}}.b (id int);")},
	}, "m")
	require.NoError(t, err)
	require.NoError(t, migrate.Apply(ctx, pool, schema, "zeta", two))
	require.NoError(t, migrate.Apply(ctx, pool, schema, "alpha", migrations(t)))

	exists, err = migrate.SchemaExists(ctx, pool, schema)
	require.NoError(t, err)
	require.True(t, exists)
	vs, err = migrate.Versions(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, []migrate.Version{{Component: "alpha", Version: 1}, {Component: "zeta", Version: 2}}, vs)
	require.Equal(t, "zeta version 2", vs[1].String())
}
