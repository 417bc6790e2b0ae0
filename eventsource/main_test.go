package eventsource_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newStore returns a migrated store in a fresh schema.
func newStore(t testing.TB) *eventsource.Store {
	t.Helper()
	s, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: pgtest.NewSchema(t)})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

// ev returns an event to append.
func ev(typ, data string) eventsource.EventData {
	return eventsource.EventData{Type: typ, Data: json.RawMessage(data)}
}

// mustAppend appends and fails the test on error.
func mustAppend(t testing.TB, s *eventsource.Store, stream string, events ...eventsource.EventData) eventsource.AppendResult {
	t.Helper()
	res, err := s.Append(context.Background(), stream, eventsource.Any, events)
	require.NoError(t, err)
	return res
}

// sequenceAll gives positions to everything committed.
func sequenceAll(t testing.TB, s *eventsource.Store) {
	t.Helper()
	_, err := s.Sequence(context.Background())
	require.NoError(t, err)
}

// countRows counts the rows of one of the store's tables.
func countRows(t testing.TB, s *eventsource.Store, table string) int {
	t.Helper()
	var n int
	require.NoError(t, s.Pool().QueryRow(context.Background(),
		fmt.Sprintf("SELECT count(*) FROM %s.%s", s.QuotedSchema(), table)).Scan(&n))
	return n
}

// exampleDB returns a pool on the test database and a fresh schema name
// for an example, and a function that drops the schema and closes the
// pool. In your code: pgxpool.New(ctx, os.Getenv("DATABASE_URL")).
func exampleDB() (*pgxpool.Pool, string, func()) {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = pgtest.TestServer().URL
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + hex.EncodeToString(b[:])
	return pool, schema, func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	}
}

// eventsWithPositions is SQL for the store's events with their positions
// (NULL while unsequenced), for checks written in SQL: the events, each
// joined to its append's range (see docs/design/eventsource.md, "Sequencing
// appends").
func eventsWithPositions(s *eventsource.Store) string {
	return fmt.Sprintf(`(SELECT e.*, a.last_position - a.last_version + e.version AS position
FROM %[1]s.events e JOIN %[1]s.appends a ON a.stream_name = e.stream_name AND e.version BETWEEN a.first_version AND a.last_version)`,
		s.QuotedSchema())
}
