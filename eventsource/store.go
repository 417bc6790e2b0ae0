package eventsource

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/kumierr"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Defaults for [Config].
const (
	SchemaDefault         = "kumi"
	MaxEventSizeDefault   = 1 << 20
	MaxBatchEventsDefault = 10_000
	// MaxBatchBytesDefault is the default bound of a batch's bytes, or
	// MaxEventSize if that is larger.
	MaxBatchBytesDefault = 64 << 20
	// MaxBatchBytesLimit is the most MaxBatchBytes (and MaxEventSize) may
	// be: encoding a batch takes a few times its size in memory, and
	// PostgreSQL takes no message over 1 GB.
	MaxBatchBytesLimit = 256 << 20
	// sequencerBatchDefault is the most appends (each with all its
	// events) one sequencer step numbers.
	sequencerBatchDefault = 5_000
	maxSchemaNameLength   = migrate.MaxSchemaNameLength
	notifyChannelSuffix   = "_events"
	cgIndexPrefix         = "events_cg_"
)

// Config configures a [Store]. The zero value of every field means its
// default.
type Config struct {
	// Schema holds the store's tables. Default "kumi". Any name PostgreSQL
	// keeps whole works (every identifier is quoted): at most 63 bytes,
	// without NUL, valid UTF-8, not starting with "pg_".
	Schema string
	// MaxEventSize bounds the bytes of one event's data plus metadata.
	// Default 1 MiB.
	MaxEventSize int
	// MaxBatchEvents bounds the events of one append. Default 10,000.
	MaxBatchEvents int
	// MaxBatchBytes bounds the bytes of one append: its events' data,
	// metadata and types. Default 64 MiB, or MaxEventSize if larger; at
	// least MaxEventSize, at most MaxBatchBytesLimit (256 MiB).
	MaxBatchBytes int
	// Logger receives a change of the store's server (a failover: see
	// [Store.Server]) at Warn; nil discards.
	Logger *slog.Logger
}

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
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = max(MaxBatchBytesDefault, c.MaxEventSize)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	if err := migrate.CheckSchema("eventsource.Config.Schema", c.Schema); err != nil {
		return err
	}
	if c.MaxEventSize < 0 {
		return &kumierr.ConfigError{Field: "eventsource.Config.MaxEventSize", Value: c.MaxEventSize, Reason: "must not be negative (0 means the default)"}
	}
	if c.MaxBatchEvents < 0 {
		return &kumierr.ConfigError{Field: "eventsource.Config.MaxBatchEvents", Value: c.MaxBatchEvents, Reason: "must not be negative (0 means the default)"}
	}
	if c.MaxEventSize > MaxBatchBytesLimit {
		return &kumierr.ConfigError{Field: "eventsource.Config.MaxEventSize", Value: c.MaxEventSize, Reason: fmt.Sprintf("must be at most MaxBatchBytesLimit (%d)", MaxBatchBytesLimit)}
	}
	if c.MaxBatchBytes < c.MaxEventSize || c.MaxBatchBytes > MaxBatchBytesLimit {
		return &kumierr.ConfigError{Field: "eventsource.Config.MaxBatchBytes", Value: c.MaxBatchBytes, Reason: fmt.Sprintf("must be in [MaxEventSize %d, MaxBatchBytesLimit %d]",
			c.MaxEventSize, MaxBatchBytesLimit)}
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

	seqMu   sync.Mutex
	seqCand seqCandidate // the sequencer's next watermark candidate

	server serverState // the server the store works on (server.go)
}

// New returns a store over pool. It does not touch the database: call
// [Store.Migrate] (or [Migrate]) once before use.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, &kumierr.ConfigError{Field: "eventsource pool", Reason: "is nil"}
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
// global positions: the schema name followed by "_events". A channel name
// is an identifier, at most 63 bytes, so for a schema name longer than 56
// bytes it is a prefix of the name, a hash of the whole name and "_events".
func (s *Store) NotifyChannel() string { return notifyChannel(s.cfg.Schema) }

func notifyChannel(schema string) string {
	if len(schema)+len(notifyChannelSuffix) <= maxSchemaNameLength {
		return schema + notifyChannelSuffix
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(schema))
	// 63 bytes: prefix (up to 38) + "_" + 16 hex digits + "_events".
	prefix := schema[:38]
	for !utf8.ValidString(prefix) {
		prefix = prefix[:len(prefix)-1]
	}
	return fmt.Sprintf("%s_%016x%s", prefix, h.Sum64(), notifyChannelSuffix)
}

// Migrate creates or upgrades the store's schema. It is idempotent and safe
// to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error { return Migrate(ctx, s.pool, s.cfg.Schema) }

// Migrate applies the event store's migrations to schema ("" means the
// default). A name [New] would refuse is refused with a [*kumierr.ConfigError].
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := (Config{Schema: schema}).WithDefaults().validate(); err != nil {
		return err
	}
	schema = Config{Schema: schema}.WithDefaults().Schema
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return err
	}
	return migrate.Apply(ctx, pool, schema, "eventsource", ms)
}

func (s *Store) signalAppended() {
	select {
	case s.appended <- struct{}{}:
	default:
	}
}

// isUniqueViolation reports a unique-constraint violation on the named index.
func isUniqueViolation(err error, index string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == index
}

// isRowFault reports an error that one row can cause on its own when it is
// read: out of memory building its text (54000: jsonb prints a number like
// 1e131071 as 131,072 digits, and a value's text is limited to 1 GB), a
// statement too complex (54001), a data exception (class 22) or data
// corruption (XX001).
func isRowFault(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") ||
		pgErr.Code == "54000" || pgErr.Code == "54001" || pgErr.Code == "XX001")
}

// isDataException reports an error PostgreSQL raised for a value it cannot
// store (SQLSTATE class 22: a number out of jsonb's range, JSON nested too
// deep for its parser, and the like).
func isDataException(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || pgErr.Code == "54001")
}
