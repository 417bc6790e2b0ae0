package inspect

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
)

// Inspection is a read-only view of one subscription, read straight from
// the tables: the demo's screen and `kumi status` show it.
//
// It does not use leasestore.Store.Snapshot on purpose: a leasestore.Store
// joins the pool as a member when it is created, and an observer that
// joins changes every worker's fair share.
type Inspection struct {
	// Schema and Subscription are the ones inspected.
	Schema       string
	Subscription string
	// Category is the one given to Inspect; "" when lag was not measured.
	Category string
	// Now is the database's clock; every time here is judged against it.
	Now time.Time
	// Head is the store's last sequenced global position.
	Head int64
	// Buckets is the subscription's N (0 when it has no lease rows yet).
	Buckets int
	// Members are the subscription's membership rows, live or not, by
	// worker id.
	Members []leasestore.Member
	// Rows are the buckets, by number.
	Rows []BucketRow
}

// BucketRow is one bucket: its lease row and its checkpoint.
type BucketRow struct {
	// BucketState is the lease row, as leasestore.Store.Snapshot reports it.
	leasestore.BucketState
	// Live reports an owner whose lease is unexpired at Inspection.Now.
	Live bool
	// Checkpoint is the stored position (0 when none), CheckpointAt when
	// it was last written (zero when none).
	Checkpoint   int64
	CheckpointAt time.Time
	// Lag is the number of the category's events of this bucket after the
	// checkpoint, or -1 when no category was given.
	Lag int64
	// Oldest is when the oldest of those events was recorded (zero when
	// there are none).
	Oldest time.Time
}

// LiveMembers counts the members that are live and, for session kind,
// whose session still holds its lock.
func (in Inspection) LiveMembers() int {
	n := 0
	for _, m := range in.Members {
		if m.Live && !m.SessionGone {
			n++
		}
	}
	return n
}

// OwnedBy returns how many buckets each live owner holds.
func (in Inspection) OwnedBy() map[string]int {
	out := map[string]int{}
	for _, r := range in.Rows {
		if r.Live {
			out[r.Owner]++
		}
	}
	return out
}

// ErrNotMigrated reports a schema without kumi's tables.
var ErrNotMigrated = errors.New("the schema has no kumi tables")

// notMigrated turns "relation/schema does not exist" into ErrNotMigrated.
func notMigrated(schema string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Errorf("schema %q: %w (run `kumi migrate` first, or pass the right --schema): %s",
			schema, ErrNotMigrated, pgErr.Message)
	}
	return err
}

const inspectBuckets = `SELECT l.bucket, l.shard_count, coalesce(l.owner, ''), l.epoch, l.granted_at, l.expires_at,
    l.heartbeat_at, coalesce(l.claim_worker, ''), l.claimed_at, coalesce(c.position, 0), c.updated_at
FROM %[1]s.lease_buckets l
LEFT JOIN %[1]s.checkpoints c ON c.subscription = l.subscription AND c.bucket = l.bucket
WHERE l.subscription = $1
ORDER BY l.bucket`

// The same judgement as leasestore's snapshot: a session member whose
// advisory lock nobody holds has no session.
const inspectMembers = `WITH held AS MATERIALIZED (
    SELECT classid, objid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT m.worker, m.kind, m.joined_at, m.heartbeat_at, m.expires_at, m.expires_at > now(),
    coalesce(m.backend_pid, 0),
    (m.kind = 'session' AND NOT EXISTS (
        SELECT 1 FROM held h
        WHERE h.classid = ((m.lock_key >> 32) & 4294967295)::oid
          AND h.objid = (m.lock_key & 4294967295)::oid))
FROM %s.lease_members m
WHERE m.subscription = $1
ORDER BY m.worker`

// Inspect reads one subscription's members, buckets and checkpoints in one
// read-only repeatable-read transaction, and — when category is not "" —
// each bucket's lag behind its checkpoint (eventsource.Store.MemberLag,
// one query per bucket). It writes nothing and takes no lock a worker
// waits for.
func Inspect(ctx context.Context, store *eventsource.Store, subscription, category string) (Inspection, error) {
	if err := eventsource.ValidateSubscription(subscription); err != nil {
		return Inspection{}, err
	}
	if category != "" {
		if err := eventsource.ValidateCategory(category); err != nil {
			return Inspection{}, err
		}
	}
	q := store.QuotedSchema()
	in := Inspection{Schema: store.Schema(), Subscription: subscription, Category: category}
	err := pgx.BeginTxFunc(ctx, store.Pool(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT now(), (SELECT last_position FROM `+q+`.sequencer WHERE id = 1)`).
				Scan(&in.Now, &in.Head); err != nil {
				return err
			}
			rows, _ := tx.Query(ctx, fmt.Sprintf(inspectBuckets, q), subscription)
			var err error
			in.Rows, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (BucketRow, error) {
				var b BucketRow
				var granted, expires, heartbeat, claimed, cpAt *time.Time
				err := r.Scan(&b.Bucket, &b.ShardCount, &b.Owner, &b.Epoch, &granted, &expires, &heartbeat,
					&b.ClaimWorker, &claimed, &b.Checkpoint, &cpAt)
				b.GrantedAt, b.Expires, b.Heartbeat = orZero(granted), orZero(expires), orZero(heartbeat)
				b.ClaimedAt, b.CheckpointAt = orZero(claimed), orZero(cpAt)
				b.Lag = -1
				return b, err
			})
			if err != nil {
				return err
			}
			rows, _ = tx.Query(ctx, fmt.Sprintf(inspectMembers, q), subscription)
			in.Members, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (leasestore.Member, error) {
				var m leasestore.Member
				var kind string
				err := r.Scan(&m.Worker, &kind, &m.Joined, &m.Heartbeat, &m.Expires, &m.Live, &m.BackendPID,
					&m.SessionGone)
				if kind == leasestore.KindSession.String() {
					m.Kind = leasestore.KindSession
				}
				return m, err
			})
			return err
		})
	if err != nil {
		return Inspection{}, notMigrated(store.Schema(), err)
	}
	for i := range in.Rows {
		r := &in.Rows[i]
		r.Live = r.Held(in.Now)
		in.Buckets = max(in.Buckets, r.ShardCount)
	}
	if category == "" {
		return in, nil
	}
	for i := range in.Rows {
		r := &in.Rows[i]
		n, oldest, err := store.MemberLag(ctx, category, r.Bucket, r.ShardCount, r.Checkpoint)
		if err != nil {
			return in, fmt.Errorf("lag of bucket %d: %w", r.Bucket, notMigrated(store.Schema(), err))
		}
		r.Lag, r.Oldest = n, oldest
	}
	return in, nil
}

// SubscriptionSummary is one subscription of a schema, for an overview.
type SubscriptionSummary struct {
	Subscription string
	Buckets      int // N; 0 when it has checkpoints but no lease rows
	Held         int // buckets with a live owner
	Members      int // live members
	Checkpoints  int // buckets with a stored checkpoint
	DeadLetters  int // pending dead letters
}

// Subscriptions lists every subscription that has lease rows, checkpoints
// or dead letters in the store's schema, sorted by name.
func Subscriptions(ctx context.Context, store *eventsource.Store) ([]SubscriptionSummary, error) {
	q := store.QuotedSchema()
	rows, _ := store.Pool().Query(ctx, fmt.Sprintf(`WITH names AS (
    SELECT subscription FROM %[1]s.lease_buckets
    UNION SELECT subscription FROM %[1]s.checkpoints
    UNION SELECT subscription FROM %[1]s.dead_letters
)
SELECT n.subscription,
    (SELECT coalesce(max(shard_count), 0) FROM %[1]s.lease_buckets l WHERE l.subscription = n.subscription),
    (SELECT count(*) FROM %[1]s.lease_buckets l WHERE l.subscription = n.subscription
        AND l.owner IS NOT NULL AND l.expires_at > now()),
    (SELECT count(*) FROM %[1]s.lease_members m WHERE m.subscription = n.subscription AND m.expires_at > now()),
    (SELECT count(*) FROM %[1]s.checkpoints c WHERE c.subscription = n.subscription),
    (SELECT count(*) FROM %[1]s.dead_letters d WHERE d.subscription = n.subscription AND d.replayed_at IS NULL)
FROM names n
ORDER BY n.subscription`, q))
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SubscriptionSummary, error) {
		var s SubscriptionSummary
		err := r.Scan(&s.Subscription, &s.Buckets, &s.Held, &s.Members, &s.Checkpoints, &s.DeadLetters)
		return s, err
	})
	if err != nil {
		return nil, notMigrated(store.Schema(), err)
	}
	return out, nil
}

// Known reports whether the store's schema knows a subscription — it has
// lease rows, checkpoints or dead letters — and its bucket count N (0
// when it has no lease rows, which alone record N).
func Known(ctx context.Context, store *eventsource.Store, subscription string) (buckets int, known bool, err error) {
	q := store.QuotedSchema()
	err = store.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT
    (SELECT coalesce(max(shard_count), 0) FROM %[1]s.lease_buckets WHERE subscription = $1),
    EXISTS (SELECT 1 FROM %[1]s.lease_buckets WHERE subscription = $1)
        OR EXISTS (SELECT 1 FROM %[1]s.checkpoints WHERE subscription = $1)
        OR EXISTS (SELECT 1 FROM %[1]s.dead_letters WHERE subscription = $1)`, q), subscription).Scan(&buckets, &known)
	if err != nil {
		return 0, false, notMigrated(store.Schema(), err)
	}
	return buckets, known, nil
}

// ConnectPool opens a pool on a connection string and checks that the
// database answers. Its errors never repeat a password: a URL that does
// not parse is reported without the parser's message (which quotes it),
// and a failed connection is redacted.
func ConnectPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, redact(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to the database: %s", connectProblem(err))
	}
	return pool, nil
}

// URLError reports a connection string that is missing or does not
// parse: a bad value, not a database that failed. Its message never
// repeats the string (which may hold a password).
type URLError struct{ msg string }

// Error says what is wrong and what a connection string looks like.
func (e *URLError) Error() string { return e.msg }

// ParseURL parses a connection string as pgxpool does; its error is a
// *URLError.
func ParseURL(url string) (*pgxpool.Config, error) {
	if url == "" {
		return nil, &URLError{"no database: set DATABASE_URL or pass --database-url"}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &URLError{fmt.Sprintf("the database URL is not a valid PostgreSQL connection string (%s); "+
			"expected postgres://USER@HOST:PORT/DBNAME?sslmode=disable (with :PASSWORD after USER if needed) or key=value pairs",
			parseProblem(url, err))}
	}
	return cfg, nil
}

// connectProblem is a failed connection's message, redacted, with each
// attempt said once: pgconn lists every attempt, and with sslmode=prefer
// (the default) the first is a TLS attempt whose "server refused TLS
// connection" only says that the server has no TLS, after which the plain
// attempt's error is the one that matters.
func connectProblem(err error) string {
	parts := strings.Split(RedactURL(err.Error()), "\n\t")
	head, attempts := parts[0], parts[1:]
	var kept []string
	for _, a := range attempts {
		if strings.HasSuffix(a, "tls error: server refused TLS connection") && len(attempts) > 1 {
			continue
		}
		if !slices.Contains(kept, a) {
			kept = append(kept, a)
		}
	}
	switch len(kept) {
	case 0:
		return head
	case 1:
		return head + " " + kept[0]
	}
	return head + "\n\t" + strings.Join(kept, "\n\t")
}

// parseProblem says what is wrong with a connection string that does not
// parse, without quoting it: url.Parse's and pgconn's messages repeat the
// string, password included.
func parseProblem(conn string, err error) string {
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		var ue *neturl.Error
		if _, perr := neturl.Parse(conn); errors.As(perr, &ue) {
			return RedactURL(ue.Err.Error())
		}
	}
	msg := err.Error()
	// pgconn: "cannot parse `<redacted string>`: <reason>".
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		msg = msg[i+3:]
	}
	return RedactURL(msg)
}

func orZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
