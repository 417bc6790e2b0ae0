package leasestore

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/kumierr"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

//go:embed queries.sql
var queriesText string

// Migrate creates or upgrades the lease tables in schema (creating the
// schema if needed). It is idempotent and safe to run from several processes
// at once; call it before [New].
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if schema == "" {
		return &kumierr.ConfigError{Field: "leasestore schema", Reason: "is required"}
	}
	ms, err := migrate.Load(migrationsFS, "migrations")
	if err != nil {
		return fmt.Errorf("leasestore: load migrations: %w", err)
	}
	return migrate.Apply(ctx, pool, schema, "leasestore", ms)
}

// queries maps a statement name of queries.sql to its text, with {{schema}}
// still in place.
var queries = parseQueries(queriesText)

func parseQueries(text string) map[string]string {
	out := map[string]string{}
	var name string
	var body []string
	flush := func() {
		if name != "" {
			out[name] = strings.TrimSpace(strings.Join(body, "\n"))
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if n, ok := strings.CutPrefix(line, "-- name: "); ok {
			flush()
			name, body = strings.TrimSpace(n), nil
			continue
		}
		if name != "" && !strings.HasPrefix(strings.TrimSpace(line), "--") {
			body = append(body, line)
		}
	}
	flush()
	return out
}

// statements holds every query rendered for one schema.
type statements map[string]string

func renderStatements(schema string) statements {
	q := pgx.Identifier{schema}.Sanitize()
	out := make(statements, len(queries))
	for name, text := range queries {
		out[name] = strings.ReplaceAll(text, "{{schema}}", q)
	}
	return out
}

func (st statements) get(name string) string {
	s, ok := st[name]
	if !ok {
		panic("leasestore: no statement " + name) // a typo in this package, caught by any test
	}
	return s
}

// lockKey derives a 64-bit advisory lock key from its parts. The parts are
// joined with NUL, which no schema, subscription or worker id contains.
func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(strings.Join(append([]string{"kumi.lease"}, parts...), "\x00")))
	return int64(h.Sum64())
}

// channelName is the NOTIFY channel of one subscription in one schema: a
// hash, so it fits PostgreSQL's 63-byte identifiers whatever the names.
func ChannelName(schema, subscription string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(schema + "\x00" + subscription))
	return fmt.Sprintf("kumi_lease_%016x", h.Sum64())
}
