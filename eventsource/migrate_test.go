package eventsource_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("IsIdempotent", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustAppend(t, s, "order-1", ev("A", `{}`))
		for range 3 {
			require.NoError(t, s.Migrate(ctx))
		}
		require.NoError(t, eventsource.Migrate(ctx, s.Pool(), s.Schema()))
		var versions, last int
		require.NoError(t, s.Pool().QueryRow(ctx, "SELECT count(*), max(version) FROM "+s.QuotedSchema()+".schema_migrations WHERE component = 'eventsource'").Scan(&versions, &last))
		require.Equal(t, last, versions, "each migration applied once")
		require.Equal(t, 1, countRows(t, s, "events"), "migrating again keeps the data")
	})

	t.Run("ManyProcessesMigratingAFreshSchemaAtOnceAllSucceed", func(t *testing.T) {
		t.Parallel()
		schema := pgtest.NewSchema(t)
		const n = 8
		var wg sync.WaitGroup
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A pool each: separate processes share nothing.
				pool := pgtest.NewPool(t, 2)
				s, err := eventsource.New(pool, eventsource.Config{Schema: schema})
				if err != nil {
					errs[i] = err
					return
				}
				<-start
				errs[i] = s.Migrate(ctx)
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "migrator %d", i)
		}
		s, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: schema})
		require.NoError(t, err)
		mustAppend(t, s, "order-1", ev("A", `{}`))
		sequenceAll(t, s)
		head, err := s.HeadPosition(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), head)
	})

	t.Run("TheInsertionSequenceHandsOutNumbersInTimeOrder", func(t *testing.T) {
		t.Parallel()
		// Per-stream order depends on it: see the migration's comment.
		s := newStore(t)
		var cache int64
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT cache_size FROM pg_sequences WHERE schemaname = $1`, s.Schema()).Scan(&cache))
		require.Equal(t, int64(1), cache)
	})

	t.Run("TheDefaultSchemaIsKumi", func(t *testing.T) {
		t.Parallel()
		s, err := eventsource.New(pgtest.Pool(t), eventsource.Config{})
		require.NoError(t, err)
		require.Equal(t, eventsource.SchemaDefault, s.Schema())
		require.Equal(t, `"kumi"`, s.QuotedSchema())
		require.Equal(t, "kumi_events", s.NotifyChannel())
	})
}

// Migration 0004 moves positions from the events to the ranges of their
// appends: events appended and sequenced before it read the same after it
// (positions, order, streams, consumer-group members), those appended but
// not yet sequenced get the next positions in insertion order, and appends
// after it continue densely.
func TestMigrationKeepsPositions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	pool := pgtest.Pool(t)
	require.NoError(t, eventsource.MigrateTo(ctx, pool, schema, 3))
	s, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	q := s.QuotedSchema()

	// Before 0004: the append statement of the time (each event drew its
	// seq), and its sequencer numbering events one by one in seq order
	// (here in SQL); a consumer-group index was built on the events.
	oldAppend := func(stream string, n int) {
		name, err := eventsource.ParseStreamName(stream)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, fmt.Sprintf(`WITH s AS (INSERT INTO %[1]s.streams AS st (stream_name, version) VALUES ($1, $2::bigint - 1)
ON CONFLICT (stream_name) DO UPDATE SET version = st.version + $2 RETURNING version)
INSERT INTO %[1]s.events (event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT gen_random_uuid(), $1, $3, $4, %[1]s.cg_hash($4), s.version - $2 + g, 'Old', jsonb_build_object('g', g)
FROM s, generate_series(1, $2::int) AS g`, q), stream, n, name.Category, name.CardinalID)
		require.NoError(t, err)
	}
	oldAppend("acct-1", 3)
	oldAppend("acct-2", 1)
	oldAppend("order-1", 2)
	oldAppend("acct-1", 2)
	_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %[1]s.events e SET position = p.pos
FROM (SELECT seq, row_number() OVER (ORDER BY seq) AS pos FROM %[1]s.events WHERE stream_name <> 'acct-2' AND NOT (stream_name = 'acct-1' AND version >= 3)) p
WHERE e.seq = p.seq;
UPDATE %[1]s.sequencer SET last_position = (SELECT max(position) FROM %[1]s.events);
CREATE INDEX events_cg_4 ON %[1]s.events (category, (((cg_hash %% 4) + 4) %% 4), position) WHERE position IS NOT NULL`, q))
	require.NoError(t, err)
	oldAppend("acct-2", 1) // after acct-2's unsequenced first event
	type key struct {
		stream  string
		version int64
	}
	before := map[key]int64{}
	rows, err := pool.Query(ctx, "SELECT stream_name, version, coalesce(position, 0) FROM "+q+".events")
	require.NoError(t, err)
	for rows.Next() {
		var k key
		var p int64
		require.NoError(t, rows.Scan(&k.stream, &k.version, &p))
		before[k] = p
	}
	require.NoError(t, rows.Err())
	require.Len(t, before, 9)

	require.NoError(t, s.Migrate(ctx))
	s, err = eventsource.New(pool, eventsource.Config{Schema: schema}) // a process started after the upgrade
	require.NoError(t, err)

	// Sequenced events: the same positions, $all and a category in the
	// same order; unsequenced ones still at 0 in their streams.
	all, err := s.ReadAll(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, all, 5)
	for i, e := range all {
		require.Equal(t, int64(i+1), e.Position)
		require.Equal(t, before[key{e.Stream, e.Version}], e.Position, "%s@%d", e.Stream, e.Version)
	}
	for _, stream := range []string{"acct-1", "acct-2", "order-1"} {
		events, err := s.ReadStream(ctx, stream, 0, 0)
		require.NoError(t, err)
		for i, e := range events {
			require.Equal(t, int64(i), e.Version)
			require.Equal(t, before[key{stream, e.Version}], e.Position, "%s@%d", stream, e.Version)
		}
	}
	acct, err := s.ReadCategory(ctx, "acct", 0, 0)
	require.NoError(t, err)
	require.Len(t, acct, 3)

	// The previous version's append statement (a process not yet
	// upgraded) is refused, writing nothing: its events would have no
	// range, so no position ever.
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.events (event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
VALUES (gen_random_uuid(), 'acct-4', 'acct', '4', 0, 0, 'Old', '{}')`, q))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23502", pgErr.Code, "not null: seq")
	require.Equal(t, 9, countRows(t, s, "events"))

	// The rest is sequenced after the head, in insertion order; a new
	// append follows densely.
	n, err := s.Sequence(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	mustAppend(t, s, "acct-3", ev("A", `{"n":10}`), ev("B", `{"n":11}`))
	mustAppend(t, s, "acct-4", ev("C", `{"n":12}`))
	sequenceAll(t, s)
	all, err = s.ReadAll(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, all, 12)
	last := map[string]int64{}
	for i, e := range all {
		require.Equal(t, int64(i+1), e.Position, "dense")
		if v, ok := last[e.Stream]; ok {
			require.Equal(t, v+1, e.Version, "%s in version order", e.Stream)
		}
		last[e.Stream] = e.Version
	}
	// In insertion order: acct-2's first event, acct-1's second append,
	// acct-2's second event.
	require.Equal(t, []string{"acct-2", "acct-1", "acct-1", "acct-2"},
		[]string{all[5].Stream, all[6].Stream, all[7].Stream, all[8].Stream})

	// The consumer-group index on the events went with their position
	// column; it is built again on the ranges, and the members partition
	// the category.
	var old int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'events' AND indexname = 'events_cg_4'`,
		schema).Scan(&old))
	require.Zero(t, old)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 4))
	seen := 0
	for m := range 4 {
		events, err := s.ReadBucket(ctx, "acct", m, 4, 0, 0)
		require.NoError(t, err)
		for _, e := range events {
			name, err := eventsource.ParseStreamName(e.Stream)
			require.NoError(t, err)
			require.Equal(t, m, eventsource.BucketOf(name, 4))
		}
		seen += len(events)
	}
	require.Equal(t, 10, seen)
}
