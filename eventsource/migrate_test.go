package eventsource_test

import (
	"context"
	"sync"
	"testing"

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
		var versions int
		require.NoError(t, s.Pool().QueryRow(ctx, "SELECT count(*) FROM "+s.QuotedSchema()+".schema_migrations WHERE component = 'eventsource'").Scan(&versions))
		require.Equal(t, migrationCount(t), versions)
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
