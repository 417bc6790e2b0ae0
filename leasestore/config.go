package leasestore

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
)

// Kind is how a [Store] proves that it still holds its buckets.
type Kind int

const (
	// KindRow (the default) keeps ownership in the lease rows alone: an
	// expiry renewed every heartbeat, and [Store.EnsureHeld] failing a
	// margin before it. Every statement is a short ordinary one, so it works
	// through a transaction pooler.
	KindRow Kind = iota
	// KindSession adds a session advisory lock held on a dedicated
	// connection. A worker whose session is gone has provably stopped, so
	// its buckets move on the next pass of any other worker instead of
	// after a TTL. The dedicated connection must not go through a
	// transaction pooler (it is refused: see Config.SessionURL).
	KindSession
)

// String returns "row" or "session", as stored in lease_workers.kind.
func (k Kind) String() string {
	switch k {
	case KindRow:
		return "row"
	case KindSession:
		return "session"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

const (
	// TTLDefault is the lease length when Config.TTL is zero.
	TTLDefault = 30 * time.Second
	// HeartbeatDivisorDefault: when Config.Heartbeat is zero it is
	// TTL / HeartbeatDivisorDefault (6s for the default TTL).
	HeartbeatDivisorDefault = 5
	// MarginDivisorDefault: when Config.Margin is zero it is
	// TTL / MarginDivisorDefault (10s for the default TTL). With the default
	// heartbeat, 3*Heartbeat + Margin < TTL: one failed or hung renewal
	// never makes EnsureHeld fail.
	MarginDivisorDefault = 3
	// MaxBuckets bounds Config.Buckets. Every bucket a worker holds is a
	// reader with its goroutines and queue: one worker holding 65,536 (a
	// pool shrunk to one survivor) collapsed — 65,000 goroutines, ~1.9 GB,
	// its passes too slow to renew — while 8,192 ran fine.
	MaxBuckets = 1 << 13
	// MinHeartbeat is the shortest heartbeat. A pass is a pipelined batch
	// and a commit (more when it claims, places or a resize runs), bounded
	// by the heartbeat: below a few tens of
	// milliseconds it is abandoned under ordinary load (every renewal lost,
	// a warning each time) and the pass loop becomes the database's main
	// load.
	MinHeartbeat = 50 * time.Millisecond
	// MinTTL is the shortest lease: HeartbeatDivisorDefault × MinHeartbeat,
	// so that the default heartbeat (TTL/5) is never below MinHeartbeat and
	// a lease outlives several passes.
	MinTTL = HeartbeatDivisorDefault * MinHeartbeat
	// MaxTTL is the longest lease: PostgreSQL's largest
	// idle_in_transaction_session_timeout (INT_MAX milliseconds, about 24.8
	// days), which every pass and fenced write sets to the TTL (see
	// docs/design/leases.md, frozen workers).
	MaxTTL = math.MaxInt32 * time.Millisecond
	// MaxWorkerLength is the longest Config.Worker (and Subscription), in
	// bytes.
	MaxWorkerLength = 200
)

// LeaseOptions choose the lease kind and its timings: the part of a
// [Config] that says how a worker holds its buckets rather than which ones
// (actors.GroupOptions.Lease is one). Zero values mean defaults.
type LeaseOptions struct {
	// Kind of lease; KindRow by default.
	Kind Kind
	// TTL is how long a lease (and a worker row) lasts without renewal,
	// between MinTTL and MaxTTL.
	TTL time.Duration
	// Heartbeat is how often the caller runs [Store.Pass]; it also bounds
	// how long one pass may take. At least MinHeartbeat, and shorter than
	// TTL.
	Heartbeat time.Duration
	// Margin is how long before the lease could lapse [Store.EnsureHeld]
	// starts failing. Heartbeat + Margin must be shorter than TTL.
	Margin time.Duration
	// SessionURL is the connection string of KindSession's dedicated
	// connection; "" uses the pool's connection config. Whenever the
	// session is opened it is refused if it behaves as one through a
	// transaction pooler (a *[SessionPoolerError]: its server connection
	// serves another client, whatever the URL looks like), or does not
	// reach the pool's server and database, or reaches a standby (a
	// *[SessionMismatchError]). PgBouncer in session mode is fine.
	// Ignored by KindRow.
	SessionURL string
	// NoListen disables the wake-ups behind [Store.Changes]: no listener,
	// neither on Notifier nor on a LISTEN connection of the store's own
	// (behind a transaction pooler LISTEN does not work); callers then rely
	// on polling every Heartbeat.
	NoListen bool
}

// withDefaults returns o with zero timings set to their defaults.
func (o LeaseOptions) withDefaults() LeaseOptions {
	if o.TTL == 0 {
		o.TTL = TTLDefault
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = o.TTL / HeartbeatDivisorDefault
	}
	if o.Margin == 0 {
		o.Margin = o.TTL / MarginDivisorDefault
	}
	return o
}

// Validate checks o as [New] does, after its defaults: the first invalid
// field is refused with a *[kumierr.ConfigError] naming it, e.g.
// "leasestore.LeaseOptions.TTL".
func (o LeaseOptions) Validate() error { return o.withDefaults().validate("leasestore.LeaseOptions.") }

// validate checks options that have had their defaults applied, naming a
// field under prefix.
func (o LeaseOptions) validate(prefix string) error {
	bad := func(field string, value any, format string, args ...any) error {
		return &kumierr.ConfigError{Field: prefix + field, Value: value, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case o.Kind != KindRow && o.Kind != KindSession:
		return bad("Kind", o.Kind, "use KindRow or KindSession")
	case o.TTL < MinTTL || o.TTL > MaxTTL:
		return bad("TTL", o.TTL, "must be between %v and %v (at least %d heartbeats of at least %v; "+
			"at most PostgreSQL's largest idle_in_transaction_session_timeout)",
			MinTTL, MaxTTL, HeartbeatDivisorDefault, MinHeartbeat)
	case o.Heartbeat <= 0:
		return bad("Heartbeat", o.Heartbeat, "must be positive (0 means TTL/%d)", HeartbeatDivisorDefault)
	case o.Heartbeat < MinHeartbeat:
		return bad("Heartbeat", o.Heartbeat, "must be at least %v and shorter than TTL (%v): "+
			"a pass, bounded by the heartbeat, needs that long", MinHeartbeat, o.TTL)
	case o.Margin <= 0:
		return bad("Margin", o.Margin, "must be positive (0 means TTL/%d)", MarginDivisorDefault)
	case o.Heartbeat >= o.TTL:
		return bad("Heartbeat", o.Heartbeat, "must be shorter than TTL (%v), or the lease lapses between renewals", o.TTL)
	case o.Heartbeat+o.Margin >= o.TTL:
		return bad("Margin", o.Margin, "plus Heartbeat (%v) must be shorter than TTL (%v), "+
			"or EnsureHeld fails between two renewals that both landed", o.Heartbeat, o.TTL)
	}
	return nil
}

// Config configures a [Store]. The zero value of every optional field means
// its default; [Config.WithDefaults] fills them in.
type Config struct {
	// Schema holding the lease tables ([Migrate] creates them). Required.
	Schema string
	// Subscription whose buckets are leased. Required; the same rules as
	// Worker.
	Subscription string
	// Worker is this worker's id, unique in the pool; "" mints a UUID. At
	// most MaxWorkerLength bytes of UTF-8 with no control characters (C0,
	// C1), no bidirectional controls and no leading or trailing white
	// space (eventsource.ValidateName's rules).
	Worker string
	// Buckets is N, the number of buckets a subscription is created with
	// (1 to MaxBuckets). Once the subscription exists the database's count
	// rules: a store configured with another one logs so once at Warn and
	// serves the database's buckets ([Store.Serving]); a resize changes
	// the count online (docs/design/resize.md).
	Buckets int
	// LeaseOptions are the lease kind and its timings: Kind, TTL,
	// Heartbeat, Margin, SessionURL and NoListen, set here as c.TTL.
	LeaseOptions
	// clock is the clock [Store.EnsureHeld] judges by; nil is the real one
	// (systemClock).
	clock clock
	// Logger receives ownership changes at Info and failures at Warn; nil
	// discards.
	Logger *slog.Logger
	// Notifier, if set, is the process's notifier (the actors runtime
	// passes its own): [Store.Changes] is then fed by a listener on it, so
	// that the process keeps one LISTEN connection however many stores it
	// runs. The store adds its channel to the notifier (which may already
	// be running) and skips its own announcements; it never starts or
	// stops the notifier, which must run for wake-ups to come. nil: the
	// store runs a notifier of its own, on a connection of its own, until
	// [Store.Close]. Ignored with NoListen.
	Notifier *eventsource.Notifier
	// Batcher, if set, carries this store's passes in round trips shared
	// with the other stores of the process that use it (see
	// [PassBatcher]); it must send on the store's pool. nil: each pass
	// has round trips of its own.
	Batcher *PassBatcher
	// Sessions, if set, is the process's shared KindSession connection
	// (the actors runtime passes its own): the store holds its session
	// lock on it beside the other stores' locks instead of on a
	// connection of its own, and its SessionURL is ignored (the Sessions'
	// rules). Its schema must be Schema. Ignored with KindRow.
	Sessions *Sessions
}

// WithDefaults returns c with every zero optional field set to its default.
// It does not mint a worker id; [New] does.
func (c Config) WithDefaults() Config {
	c.LeaseOptions = c.LeaseOptions.withDefaults()
	if c.clock == nil {
		c.clock = systemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks c as [New] does, after its defaults: the error is a
// *[kumierr.ConfigError] naming the field.
func (c Config) Validate() error { return c.WithDefaults().validate() }

// validate checks a config that has had its defaults applied.
func (c Config) validate() error {
	bad := func(field string, value any, format string, args ...any) error {
		return &kumierr.ConfigError{Field: "leasestore.Config." + field, Value: value, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Schema == "":
		return bad("Schema", nil, "is required")
	case c.Subscription == "":
		return bad("Subscription", nil, "is required")
	case eventsource.ValidateSubscription(c.Subscription) != nil:
		return bad("Subscription", c.Subscription, "%v", eventsource.ValidateSubscription(c.Subscription))
	case c.Worker != "" && eventsource.ValidateName("worker id", c.Worker, MaxWorkerLength) != nil:
		return bad("Worker", c.Worker, "%v; use printable characters", eventsource.ValidateName("worker id", c.Worker, MaxWorkerLength))
	case c.Buckets < 1 || c.Buckets > MaxBuckets:
		return bad("Buckets", c.Buckets, "must be between 1 and %d", MaxBuckets)
	}
	return c.LeaseOptions.validate("leasestore.Config.")
}

// sessionConfig returns the connection config of KindSession's dedicated
// connection. Whether it goes through a transaction pooler is judged by
// what it does when the session opens (see session.pinned), not by its
// URL. Neither the URL nor the parser's message (which repeats it) ever
// reaches the error.
func sessionConfig(sessionURL string, poolConfig *pgx.ConnConfig) (*pgx.ConnConfig, error) {
	if sessionURL == "" {
		return poolConfig.Copy(), nil
	}
	parsed, err := pgx.ParseConfig(sessionURL)
	if err != nil {
		return nil, &kumierr.ConfigError{Field: "leasestore.Config.SessionURL", Reason: "cannot be parsed as a PostgreSQL connection string (check its syntax)"}
	}
	return parsed, nil
}
