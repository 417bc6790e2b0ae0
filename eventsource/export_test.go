package eventsource

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/migrate"
)

// MigrateTo applies the store's migrations up to version only, for a test
// of a later migration on data written before it.
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, schema string, version int) error {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return err
	}
	return migrate.Apply(ctx, pool, schema, "eventsource", ms[:version])
}

// BucketSQL exposes the statement of a consumer-group bucket's read, for
// a test that checks its plan.
func (s *Store) BucketSQL(size int) string { return bucketRead(s.q, size).full }

// TextSize exposes the bound of an event's text form, for a test that
// checks it against PostgreSQL's.
var TextSize = textSize

// BucketLagsSQL exposes the statement of Store.BucketLags for sizes, for
// its plan.
func (s *Store) BucketLagsSQL(sizes ...int) string { return bucketLagsSQL(s.q, sizes) }

// Measure measures the replica's lag once, as its Start does every
// LagInterval.
func (r *ReadReplica) Measure(ctx context.Context) ReadReplicaStats { return r.measure(ctx) }
