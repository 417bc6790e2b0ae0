package eventsource

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Defaults for [Config].
const (
	SchemaDefault          = "kumi"
	MaxEventSizeDefault    = 1 << 20
	MaxBatchEventsDefault  = 10_000
	SequencerBatchDefault  = 5_000
	maxSchemaNameLength    = 63
	notifyChannelSuffix    = "_events"
	cgIndexPrefix          = "events_cg_"
	schemaNameForbiddenSet = "\x00"
)

// Config configures a [Store]. The zero value of every field means its
// default.
type Config struct {
	// Schema holds the store's tables. Default "kumi". Any name PostgreSQL
	// accepts works: every identifier is quoted.
	Schema string
	// MaxEventSize bounds the bytes of one event's data plus metadata.
	// Default 1 MiB.
	MaxEventSize int
	// MaxBatchEvents bounds the events of one append. Default 10,000.
	MaxBatchEvents int
}

// ConfigError reports an invalid configuration field.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "kumi: invalid config " + e.Field + ": " + e.Reason }

// ConfigError marks the error as an invalid configuration (see
// supervision's classifier).
func (e *ConfigError) ConfigError() bool { return true }

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = SchemaDefault
	}
	if c.MaxEventSize == 0 {
		c.MaxEventSize = MaxEventSizeDefault
	}
	if c.MaxBatchEvents == 0 {
		c.MaxBatchEvents = MaxBatchEventsDefault
	}
	return c
}

func (c Config) validate() error {
	if len(c.Schema) > maxSchemaNameLength {
		return &ConfigError{"Schema", fmt.Sprintf("longer than %d bytes", maxSchemaNameLength)}
	}
	if strings.ContainsAny(c.Schema, schemaNameForbiddenSet) {
		return &ConfigError{"Schema", "contains NUL"}
	}
	if c.MaxEventSize < 0 {
		return &ConfigError{"MaxEventSize", "negative"}
	}
	if c.MaxBatchEvents < 0 {
		return &ConfigError{"MaxBatchEvents", "negative"}
	}
	return nil
}

// Store is the PostgreSQL event store. It is safe for concurrent use and
// holds no goroutines of its own.
type Store struct {
	pool *pgxpool.Pool
	cfg  Config
	q    string // quoted schema
	sql  queries

	appended chan struct{} // local wake-up for a Sequencer; capacity 1

	cgMu      sync.Mutex
	cgIndexes map[int]bool
}

// New returns a store over pool. It does not touch the database: call
// [Store.Migrate] (or [Migrate]) once before use.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, &ConfigError{"pool", "nil"}
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	q := pgx.Identifier{cfg.Schema}.Sanitize()
	return &Store{
		pool:      pool,
		cfg:       cfg,
		q:         q,
		sql:       newQueries(q),
		appended:  make(chan struct{}, 1),
		cgIndexes: map[int]bool{},
	}, nil
}

// Pool returns the store's pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Schema returns the store's schema name (unquoted).
func (s *Store) Schema() string { return s.cfg.Schema }

// QuotedSchema returns the store's schema name quoted for SQL.
func (s *Store) QuotedSchema() string { return s.q }

// NotifyChannel is the LISTEN channel on which the sequencer announces new
// global positions.
func (s *Store) NotifyChannel() string { return s.cfg.Schema + notifyChannelSuffix }

// Migrate creates or upgrades the store's schema. It is idempotent and safe
// to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error { return Migrate(ctx, s.pool, s.cfg.Schema) }

// Migrate applies the event store's migrations to schema.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if schema == "" {
		schema = SchemaDefault
	}
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return err
	}
	return migrate.Apply(ctx, pool, schema, "eventsource", ms)
}

// EnsureConsumerGroupIndex creates, if missing, the index that makes a
// consumer-group member's read of a group of n an index range scan. Workers
// call it when a subscription starts; it is a no-op after the first call.
// Creating it on a large table takes a while and blocks appends meanwhile;
// on a busy store, create it ahead with `kumi migrate --group-size n`.
func (s *Store) EnsureConsumerGroupIndex(ctx context.Context, n int) error {
	if n < 1 {
		return &ConfigError{"group size", "must be at least 1"}
	}
	s.cgMu.Lock()
	defer s.cgMu.Unlock()
	if s.cgIndexes[n] {
		return nil
	}
	name := pgx.Identifier{fmt.Sprintf("%s%d", cgIndexPrefix, n)}.Sanitize()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Serialise with migrations and other workers creating the same index.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrate.LockKey(s.cfg.Schema)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(
		"CREATE INDEX IF NOT EXISTS %s ON %s.events (category, %s, position) WHERE position IS NOT NULL",
		name, s.q, memberExpr(n))); err != nil {
		return fmt.Errorf("kumi: create consumer-group index for %d members: %w", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	s.cgIndexes[n] = true
	return nil
}

// memberExpr is the SQL expression of an event's member in a group of n. n
// is an integer literal so that the planner matches it to the
// consumer-group index.
func memberExpr(n int) string {
	return fmt.Sprintf("(((cg_hash %% %d) + %d) %% %d)", n, n, n)
}

func (s *Store) signalAppended() {
	select {
	case s.appended <- struct{}{}:
	default:
	}
}

// isUniqueViolation reports a unique-constraint violation on the named index.
func isUniqueViolation(err error, index string) bool {
	var pgErr interface {
		SQLState() string
	}
	if !errors.As(err, &pgErr) || pgErr.SQLState() != "23505" {
		return false
	}
	return strings.Contains(err.Error(), index)
}
