// Package migrate applies a component's embedded, numbered SQL migrations to
// one schema, once, safely when several processes start at the same time.
//
// Each component (the event store, the lease store) keeps its migrations as
// files named NNNN_description.sql in an embedded filesystem. [Apply] takes a
// transaction-scoped advisory lock derived from the schema name, creates the
// schema and the version table if needed, and applies, each in its own
// transaction with its version row, every file whose number is above the
// component's recorded version. Gaps in the numbering are refused. The
// placeholder {{schema}} in a file is replaced by the quoted schema name.
package migrate

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/kumierr"
)

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Load reads the migrations in dir of fsys, sorted by version; a missing or
// repeated number is an error.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migrate: file %q is not named NNNN_description.sql", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrate: expected migration %d, found %q (gap or duplicate)", i+1, m.Name)
		}
	}
	return out, nil
}

// MaxSchemaNameLength is the longest schema name, in bytes, that
// PostgreSQL keeps whole (NAMEDATALEN - 1). It cuts a longer identifier
// without a word, so two long names that share their first 63 bytes would
// name one schema.
const MaxSchemaNameLength = 63

// CheckSchema refuses a schema name that PostgreSQL would not keep as
// given: empty, over [MaxSchemaNameLength] bytes, with NUL or invalid
// UTF-8, or starting with "pg_" (reserved for system schemas). Its error is
// a *kumierr.ConfigError naming field, the caller's name for the schema
// ("eventsource.Config.Schema", "leasestore schema").
func CheckSchema(field, schema string) error {
	reason := ""
	switch {
	case schema == "":
		reason = "empty"
	case len(schema) > MaxSchemaNameLength:
		reason = fmt.Sprintf("%d bytes, longer than the %d PostgreSQL keeps (it would cut the name)", len(schema), MaxSchemaNameLength)
	case strings.ContainsRune(schema, 0):
		reason = "contains NUL"
	case !utf8.ValidString(schema):
		reason = "not valid UTF-8"
	case strings.HasPrefix(strings.ToLower(schema), "pg_"):
		reason = `starts with "pg_", which PostgreSQL reserves for system schemas`
	default:
		return nil
	}
	return &kumierr.ConfigError{Field: field, Value: schema, Reason: reason}
}

// newerSchema reports a schema migrated by a newer binary: this one does
// not know its latest migrations, and must be upgraded. No retry helps, so
// it is a *kumierr.ConfigError, naming "<component> schema".
func newerSchema(component, schema string, version, known int) error {
	return &kumierr.ConfigError{Field: component + " schema", Value: schema, Reason: fmt.Sprintf(
		"is at version %d of %s's migrations, newer than this binary's %d: upgrade the binary", version, component, known)}
}

// LockKey is the advisory lock key that serialises migrations of one schema.
func LockKey(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("kumi.migrate." + schema))
	return int64(h.Sum64())
}

// Apply brings component's migrations in schema up to date. It is
// idempotent and safe to run from several processes at once.
func Apply(ctx context.Context, pool *pgxpool.Pool, schema, component string, migrations []Migration) error {
	if err := CheckSchema(component+" schema", schema); err != nil {
		return err
	}
	q := pgx.Identifier{schema}.Sanitize()
	// An up-to-date schema needs no lock and no DDL, so a worker can run as
	// a role without CREATE privileges once an operator has migrated; and a
	// newer one is reported before any DDL, which that role would be
	// refused ("permission denied") before it learnt it should upgrade.
	if current, err := currentVersion(ctx, pool, q, component); err == nil {
		switch {
		case current == len(migrations):
			return nil
		case current > len(migrations):
			return newerSchema(component, schema, current, len(migrations))
		}
	}
	for {
		applied, err := applyNext(ctx, pool, q, schema, component, migrations)
		if err != nil {
			return err
		}
		if !applied {
			return nil
		}
	}
}

// currentVersion reads component's version without creating anything; an
// error means it cannot tell (no schema or table yet, no privilege).
func currentVersion(ctx context.Context, pool *pgxpool.Pool, q, component string) (int, error) {
	var v int
	err := pool.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+q+".schema_migrations WHERE component = $1",
		component).Scan(&v)
	return v, err
}

func applyNext(ctx context.Context, pool *pgxpool.Pool, q, schema, component string, migrations []Migration) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrate %s: begin: %w", component, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", LockKey(schema)); err != nil {
		return false, fmt.Errorf("migrate %s: lock: %w", component, err)
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+q); err != nil {
		return false, fmt.Errorf("migrate %s: create schema: %w", component, err)
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+q+`.schema_migrations (
		component text NOT NULL, version int NOT NULL, name text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (component, version))`); err != nil {
		return false, fmt.Errorf("migrate %s: version table: %w", component, err)
	}
	var current int
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+q+".schema_migrations WHERE component = $1",
		component).Scan(&current); err != nil {
		return false, fmt.Errorf("migrate %s: read version: %w", component, err)
	}
	if current > len(migrations) {
		return false, newerSchema(component, schema, current, len(migrations))
	}
	if current == len(migrations) {
		return false, tx.Commit(ctx)
	}
	m := migrations[current]
	if _, err := tx.Exec(ctx, strings.ReplaceAll(m.SQL, "{{schema}}", q)); err != nil {
		return false, fmt.Errorf("migrate %s: %s: %w", component, m.Name, err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+q+".schema_migrations (component, version, name) VALUES ($1, $2, $3)",
		component, m.Version, m.Name); err != nil {
		return false, fmt.Errorf("migrate %s: record %s: %w", component, m.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migrate %s: commit %s: %w", component, m.Name, err)
	}
	return true, nil
}

// Version is one component's latest applied migration in a schema.
type Version struct {
	Component string // "eventsource", "leasestore"
	Version   int    // the number of its latest migration
}

// String is "eventsource version 1".
func (v Version) String() string { return fmt.Sprintf("%s version %d", v.Component, v.Version) }

// SchemaExists reports whether schema exists.
func SchemaExists(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	var exists bool
	err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists)
	return exists, err
}

// Versions returns each component's latest applied migration in schema,
// by component: none before the first migration (or without the schema).
// It creates nothing.
func Versions(ctx context.Context, pool *pgxpool.Pool, schema string) ([]Version, error) {
	q := pgx.Identifier{schema}.Sanitize()
	var table *string
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::text", q+".schema_migrations").Scan(&table); err != nil {
		return nil, err
	}
	if table == nil {
		return nil, nil
	}
	rows, _ := pool.Query(ctx, "SELECT component, max(version) FROM "+q+".schema_migrations GROUP BY component ORDER BY component")
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Version])
}
