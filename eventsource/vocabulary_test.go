package eventsource_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// Migration 0002 renames cg_member to cg_bucket. A rename keeps the
// function's OID, so indexes built before it stay valid and the planner
// still uses them after it: kumi's own consumer-group index (which spells
// the expression out) and one an operator built on the function itself.
func TestTheVocabularyMigrationKeepsTheConsumerGroupIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.NewSchema(t)
	q := pgx.Identifier{schema}.Sanitize()
	require.NoError(t, eventsource.MigrateTo(ctx, pool, schema, 1))
	_, err := pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.events (event_id, stream_name, category, cardinal_id, cg_hash, version, type, data, position)
SELECT gen_random_uuid(), c || '-' || (i %% 500), c, (i %% 500)::text, %[1]s.cg_hash((i %% 500)::text), i / 500, 'E', '{}', i + 1
FROM generate_series(0, 29999) AS i, LATERAL (SELECT CASE WHEN i %% 3 = 0 THEN 'cg' ELSE 'noise' END AS c) cat`, q))
	require.NoError(t, err)
	// The consumer-group index as version 1 built it, on events (migration
	// 0004 moves them to the appends table; this test is about 0002).
	const v1Bucket = "(((cg_hash % 8) + 8) % 8)"
	_, err = pool.Exec(ctx, "CREATE INDEX events_cg_8 ON "+q+".events (category, "+v1Bucket+", position) WHERE position IS NOT NULL")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE INDEX events_by_fn ON "+q+".events (category, "+q+".cg_member(cg_hash, 8), position) WHERE position IS NOT NULL")
	require.NoError(t, err)
	indexes := func() map[string]bool {
		rows, err := pool.Query(ctx, `SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname IN ('events_cg_8', 'events_by_fn')`, schema)
		require.NoError(t, err)
		out := map[string]bool{}
		for rows.Next() {
			var name string
			var valid bool
			require.NoError(t, rows.Scan(&name, &valid))
			out[name] = valid
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, map[string]bool{"events_cg_8": true, "events_by_fn": true}, indexes())

	require.NoError(t, eventsource.MigrateTo(ctx, pool, schema, 2))
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version) FROM "+q+".schema_migrations WHERE component = 'eventsource'").Scan(&version))
	require.GreaterOrEqual(t, version, 2, "0002 applied (and any migration after it)")
	var member, bucket bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regproc($1) IS NOT NULL, to_regproc($2) IS NOT NULL",
		q+".cg_member", q+".cg_bucket").Scan(&member, &bucket))
	require.False(t, member, "cg_member is renamed")
	require.True(t, bucket, "to cg_bucket")
	require.Equal(t, map[string]bool{"events_cg_8": true, "events_by_fn": true}, indexes(), "both indexes are still valid")

	_, err = pool.Exec(ctx, "ANALYZE "+q+".events")
	require.NoError(t, err)
	plan := func(sql string, args ...any) string {
		rows, err := pool.Query(ctx, "EXPLAIN "+sql, args...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	p := plan("SELECT position FROM "+q+".events WHERE category = $1 AND ("+v1Bucket+", position) > ($2, $3) AND "+
		v1Bucket+" <= $2 AND position IS NOT NULL ORDER BY "+v1Bucket+", position LIMIT $4", "cg", 3, 0, 100)
	require.Contains(t, p, "Index Scan using events_cg_8", "the bucket read, plan:\n%s", p)
	_, err = pool.Exec(ctx, "DROP INDEX "+q+".events_cg_8")
	require.NoError(t, err)
	p = plan("SELECT position FROM " + q + ".events WHERE category = 'cg' AND " + q + ".cg_bucket(cg_hash, 8) = 3 AND position IS NOT NULL ORDER BY position LIMIT 100")
	require.Contains(t, p, "events_by_fn", "a query on cg_bucket uses the index built on cg_member, plan:\n%s", p)

	var b int
	require.NoError(t, pool.QueryRow(ctx, "SELECT "+q+".cg_bucket($1, $2)", int64(-7), 3).Scan(&b))
	require.Equal(t, eventsource.BucketOfHash(-7, 3), b)
}
