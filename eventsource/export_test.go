package eventsource

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/migrate"
)

// BucketSQL exposes the statement of a consumer-group bucket's read, for
// a test that checks its plan.
func (s *Store) BucketSQL(size int) string { return bucketRead(s.q, size).full }

// TextSize exposes the bound of an event's text form, for a test that
// checks it against PostgreSQL's.
var TextSize = textSize

// MigrateTo applies the store's first version migrations to schema, as a
// binary that knew no later one would: for tests of an upgrade.
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, schema string, version int) error {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return err
	}
	return migrate.Apply(ctx, pool, schema, "eventsource", ms[:version])
}
