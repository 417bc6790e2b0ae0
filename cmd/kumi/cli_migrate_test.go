package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	env := []string{"DATABASE_URL=" + pgtest.URL(t)}
	// It says when it creates the schema (a mistyped --schema shows), then
	// that the schema is up to date: idempotent.
	for _, want := range []string{`created schema "` + schema + `": `, `schema "` + schema + `" is up to date: `} {
		r := kumi(t, env, "--schema", schema, "migrate", "--group-size", "4")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, want+"eventsource version 7, leasestore version 5")
		require.Contains(t, r.stdout, "consumer-group index for 4 buckets: present")
	}
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'events_cg_4'`, schema).Scan(&n))
	require.Equal(t, 1, n)
	r := kumi(t, env, "--schema", schema, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "has no subscriptions yet")

	// The ownership record's retention is set with it, and refused negative.
	r = kumi(t, env, "--schema", schema, "migrate", "--ownership-retention", "720h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "ownership record: keeps changes for 720h0m0s")
	var keep time.Duration
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT keep FROM `+pgx.Identifier{schema, "ownership_retention"}.Sanitize()).Scan(&keep))
	require.Equal(t, 720*time.Hour, keep)
	r = kumi(t, env, "--schema", schema, "migrate", "--ownership-retention=-1h")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "--ownership-retention -1h0m0s: must not be negative")
}

// A schema that exists without kumi's tables is migrated, and says so; a
// name is quoted, so any name eventsource accepts works, and one it
// refuses is a usage error naming the rule.
func TestMigrateSchemaNames(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=" + pgtest.URL(t)}
	schema := pgtest.NewSchema(t)
	_, err := pgtest.Pool(t).Exec(context.Background(), `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	r := kumi(t, env, "--schema", schema, "migrate")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `schema "`+schema+`" migrated to eventsource version 7, leasestore version 5 (was: no kumi tables)`)

	odd := pgtest.NewSchema(t) + " Odd!"
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+odd+`" CASCADE`)
	})
	r = kumi(t, env, "--schema", odd, "migrate")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `created schema "`+odd+`"`)

	r = kumi(t, env, "--schema", "pg_mine", "migrate")
	require.Equal(t, exitUsage, r.code, r.stdout)
	require.Contains(t, r.stderr, `--schema: `)
	require.Contains(t, r.stderr, `"pg_"`)
	r = kumi(t, env, "--schema", strings.Repeat("s", 64), "migrate")
	require.Equal(t, exitUsage, r.code, r.stdout)
	require.Contains(t, r.stderr, "longer than the 63 PostgreSQL keeps")
}
