package leasestore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/kumierr"
)

// Store is one worker's view of one subscription's bucket leases. Its
// methods are safe for concurrent use; Pass, Renew, HandOver, Release,
// Leave and EnsureBuckets run one at a time. Its Start and Stop follow
// kumi's lifecycle contract (docs/design/architecture.md, "Lifecycle").
type Store struct {
	pool    *pgxpool.Pool
	cfg     Config
	st      statements
	log     *slog.Logger
	usable  time.Duration // TTL - Margin
	channel string
	offset  int // where this worker's claim scan starts, to spread rivals
	keys    struct{ ensure, place int64 }
	session *session // KindSession only

	opMu    sync.Mutex // serialises the operations that write
	ensured bool       // EnsureBuckets succeeded; under opMu
	warned  bool       // the database's bucket count differs from Config.Buckets, and it was logged; under opMu
	// joined is the subscription's serving generation and bucket count
	// as the join read them, {-1, -1} when it found no subscription: the
	// next EnsureBuckets takes them instead of reading them again, or goes
	// straight to the creation (one round trip less for each group a
	// process starts). Under opMu.
	joined *[2]int
	// abandoned counts the passes abandoned in a row (see passBound);
	// under opMu.
	abandoned int
	// steady: the last pass that landed ran no statement after its first
	// batch; only then does the next one go through Config.Batcher. Under
	// opMu.
	steady bool

	viewMu  sync.RWMutex
	view    map[int]heldLease // what this worker believes it holds
	serving [2]int            // the serving generation and its bucket count, as last read; under viewMu

	changes     <-chan struct{}       // the listener's; never fires without one
	listener    *eventsource.Listener // nil with NoListen
	ownNotifier *eventsource.Notifier // the store's own, when Config.Notifier is nil
	received    atomic.Int64          // notifications received, its own included
	life        startstop.Lifecycle
	started     atomic.Bool // Start succeeded
	closed      atomic.Bool // Stop began
}

// heldLease is one bucket of the view.
type heldLease struct {
	epoch   int64
	expires time.Time // the database's expiry, as last read
	renewed reading   // Clock reading when the renewal that set expires STARTED
	handoff bool      // a claim is pending: draining, no longer renewed
	fenced  bool      // a fence check found the bucket gone
	gen     uint64    // KindSession: the session generation the pass that renewed it ran under
	slot    slotInfo  // the slot's generation, bound and readiness, as last read
}

// Lease is a bucket held by this worker.
type Lease struct {
	// Bucket is the bucket within its generation, 0..Buckets-1. For a
	// subscription never resized (generation 0) it is also its Slot.
	Bucket int
	// Epoch is the fencing token of this holding: it grows on every change
	// of owner and on every [FenceOut]. Pass it to [Store.Fence] or
	// [Store.Guard] with every write.
	Epoch int64
	// Expires is the database's expiry of the lease when last renewed (by
	// the database's clock; compare it only with database times).
	Expires time.Time
	// Slot is eventsource.Slot(Generation, Bucket): the key of the lease
	// and of the bucket's checkpoint, and what [Store.EnsureHeld],
	// [Store.Fence], [Store.Guard], [Store.HandOver], [Store.Release],
	// [Store.ProposeCut] and [Store.DrainTx] take.
	Slot int
	// Generation is the bucket's generation (docs/design/resize.md) and Buckets
	// its bucket count: the consumer-group size its reader reads by.
	Generation, Buckets int
	// Bound is, for a bucket of the serving generation during a resize,
	// the bound its lease row carried when this pass granted or renewed
	// it: a proposal, or the cut once decided. A reader started with
	// Bound.Resizing false in state sealing proposes before delivering
	// ([Store.ProposeCut]).
	Bound Bound
	// Ready reports that the bucket's reader may run: always for the
	// serving generation; for the next generation's, once its feeders
	// have all drained (after the switch). A held bucket that is not
	// ready is on standby: renewed, with no reader.
	Ready bool
}

// New validates cfg and returns the worker's Store, not started: it has
// not joined, and its methods return [ErrNotStarted] until [Store.Start].
// It makes no connection. The tables must exist: call [Migrate] first.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, errors.New("leasestore: New needs a pool")
	}
	if cfg.Worker == "" {
		cfg.Worker = uuid.NewString()
	}
	s := &Store{
		pool:    pool,
		cfg:     cfg,
		st:      renderStatements(cfg.Schema),
		log:     cfg.Logger.With("subscription", cfg.Subscription, "worker", cfg.Worker),
		usable:  usableFor(cfg.TTL, cfg.Margin),
		channel: ChannelName(cfg.Schema, cfg.Subscription),
		view:    map[int]heldLease{},
		changes: make(chan struct{}),
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(cfg.Worker))
	s.offset = int(h.Sum32() % (1 << 16)) // the claim statement takes it modulo each generation's count
	s.keys.ensure = lockKey("ensure", cfg.Schema, cfg.Subscription)
	s.keys.place = lockKey("place", cfg.Schema, cfg.Subscription)
	if cfg.Kind == KindSession && cfg.Sessions != nil {
		if cfg.Sessions.schema != cfg.Schema {
			return nil, &kumierr.ConfigError{Field: "leasestore.Config.Sessions", Value: cfg.Sessions.schema,
				Reason: fmt.Sprintf("is for schema %q, not the store's Schema %q: its locks would not be where the store's workers look", cfg.Sessions.schema, cfg.Schema)}
		}
		s.session = &session{sessionConn: cfg.Sessions.c, key: lockKey("session", cfg.Schema, cfg.Subscription, cfg.Worker),
			bound: s.usable}
	} else if cfg.Kind == KindSession {
		cc, err := sessionConfig(cfg.SessionURL, pool.Config().ConnConfig)
		if err != nil {
			return nil, err
		}
		s.session = newSession(cc, lockKey("session", cfg.Schema, cfg.Subscription, cfg.Worker), s.st, pool,
			s.usable)
	}
	return s, nil
}

// start joins (see [Store.Start]); failing, it undoes what it did.
func (s *Store) start(ctx context.Context) error {
	if s.session != nil {
		if err := s.session.open(ctx); err != nil {
			return err
		}
	}
	if err := s.joinRetrying(ctx); err != nil {
		if s.session != nil {
			s.session.close()
		}
		return err
	}
	if !s.cfg.NoListen {
		if err := s.listen(ctx); err != nil {
			if s.session != nil {
				s.session.close()
			}
			return err
		}
	}
	s.started.Store(true)
	return nil
}

// strayCancelRetries is how many times a join cancelled on the server
// while its context is live is tried again.
const strayCancelRetries = 3

// joinRetrying is join, tried again when the server cancelled it
// (query_canceled) while ctx is live: that cancel was not the join's. A
// cancel request is addressed to a backend, not a statement, so one sent
// for a statement that ended just before it arrived (a pass abandoned at
// its bound on the same pooled connection) cancels whatever that backend
// runs next; a group's start failed so, and its worker process with it,
// in TestManySessionSubscriptionsOnADefaultServer
// (TestAJoinCancelledByAStrayCancelIsTriedAgain). The join is idempotent
// (an upsert of the worker row), and a failed join committed nothing.
func (s *Store) joinRetrying(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		err := s.join(ctx)
		var pgErr *pgconn.PgError
		if err == nil || ctx.Err() != nil || attempt == strayCancelRetries ||
			!errors.As(err, &pgErr) || pgErr.Code != "57014" {
			return err
		}
		s.log.Info("lease join cancelled on the server, not by its caller; joining again", "err", err)
	}
}

// join registers (or heartbeats) the worker row.
func (s *Store) join(ctx context.Context) error {
	var pid *int32
	if s.session != nil {
		p := s.session.backendPID()
		pid = &p
	}
	fail := func(err error) error {
		return fmt.Errorf("leasestore: join subscription %q: %w%s", s.cfg.Subscription, err, migrateHint(err))
	}
	if s.cfg.Batcher != nil {
		// The joins of the process's stores that start together share a
		// round trip, as their passes do (see PassBatcher).
		hb, v, notified, err := s.cfg.Batcher.join(ctx, s, pid)
		switch {
		case errors.Is(err, errRunAlone):
		case err != nil:
			return fail(err)
		default:
			s.joinedAs(hb, v)
			if hb.joined && !notified {
				if _, err := s.pool.Exec(ctx, s.st.get("notify"), s.channel, "join:"+s.cfg.Worker); err != nil {
					// Joined: the others count it at their next pass.
					s.log.Warn("lease join not announced; the other workers count it at their next pass", "err", err)
				}
			}
			return nil
		}
	}
	// One round trip and the COMMIT (and the notification, when the
	// worker was not live): a process starting many groups starts each
	// in a few round trips.
	return s.runPipelined(ctx, func(conn *commitTail) error {
		b := &pgx.Batch{}
		s.queueJoin(b, pid)
		br := conn.SendBatch(ctx, b)
		hb, v, err := s.readJoin(br)
		if err != nil {
			return fail(err)
		}
		if err := br.Close(); err != nil {
			return fail(err)
		}
		s.joinedAs(hb, v)
		if hb.joined {
			return s.notify(ctx, conn, "join")
		}
		return nil
	})
}

// queueJoin queues a join's statements on b: begin, the settings, the
// heartbeat.
func (s *Store) queueJoin(b *pgx.Batch, pid *int32) {
	b.Queue(beginSQL)
	b.Queue(s.st.get("pass_begin"), s.boundLocksArg())
	b.Queue(s.st.get("worker_heartbeat"), s.workerArgs(pid)...)
}

// readJoin reads the results of the statements queueJoin queued from br,
// leaving it open for what follows; it closes br only on an error.
func (s *Store) readJoin(br pgx.BatchResults) (heartbeat, subscriptionView, error) {
	var v subscriptionView
	for range 2 {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return heartbeat{}, v, err
		}
	}
	hb, err := scanHeartbeat(br.QueryRow(), &v)
	if err != nil {
		_ = br.Close()
		return heartbeat{}, v, err
	}
	return hb, v, nil
}

// joinedAs keeps what a join read of the subscription for the next
// EnsureBuckets: its serving generation and bucket count, or that it has
// none yet (see ensureBuckets).
func (s *Store) joinedAs(hb heartbeat, v subscriptionView) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if hb.found {
		s.joined = &[2]int{v.generation, v.buckets}
	} else {
		s.joined = &[2]int{-1, -1}
	}
}

func (s *Store) workerArgs(pid *int32) []any {
	var key *int64
	if s.session != nil {
		key = &s.session.key
	}
	return []any{s.cfg.Subscription, s.cfg.Worker, s.cfg.Kind.String(), s.cfg.TTL, pid, key}
}

// migrateHint adds advice to an error that says the tables are missing.
func migrateHint(err error) string {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) && (pgErr.SQLState() == "42P01" || pgErr.SQLState() == "3F000") {
		return " (run leasestore.Migrate for this schema first)"
	}
	return ""
}

// Worker returns this worker's id.
func (s *Store) Worker() string { return s.cfg.Worker }

// Config returns the store's configuration with its defaults applied.
func (s *Store) Config() Config { return s.cfg }

// EnsureBuckets creates the subscription — its subscriptions row, its
// generation 0 and its lease rows — with Config.Buckets buckets if it does
// not exist. It is idempotent and safe to call from many workers at once.
// Once the subscription exists the database's bucket count rules:
// Config.Buckets only applies when a subscription is created (a resize
// changes it, docs/design/resize.md), and a store whose Config.Buckets differs
// from the serving generation's count logs so once at Warn and serves the
// database's generations.
// Lease rows that a worker of an older version created without a
// subscriptions row are adopted, with their count. [Store.Pass] calls it
// once if it has not been called.
func (s *Store) EnsureBuckets(ctx context.Context) error {
	if err := s.running(); err != nil {
		return err
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	return s.ensureBuckets(ctx)
}

func (s *Store) ensureBuckets(ctx context.Context) error {
	var gen, n int
	var err error
	switch j := s.joined; {
	case j != nil && j[1] < 0:
		// The join found no subscription: straight to its creation,
		// which is idempotent under its lock (a worker that created it
		// meanwhile leaves it to be read there).
		s.joined = nil
		err = pgx.ErrNoRows
	case j != nil:
		// The join found the subscription (a subscription is never
		// deleted): no need to read it again.
		s.joined = nil
		gen, n = j[0], j[1]
	default:
		err = s.pool.QueryRow(ctx, s.st.get("subscription_present"), s.cfg.Subscription).Scan(&gen, &n)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// One round trip, the COMMIT in it: nothing is decided between
		// the statements (was a round trip and the COMMIT's).
		b := &pgx.Batch{}
		b.Queue(beginSQL)
		b.Queue(s.st.get("ensure_lock"), s.keys.ensure)
		b.Queue(s.st.get("subscription_create"), s.cfg.Subscription, s.cfg.Buckets)
		b.Queue("COMMIT")
		err = s.runOneTrip(ctx, b, func(br pgx.BatchResults) error {
			_, err := br.Exec()
			if err == nil {
				_, err = br.Exec()
			}
			if err == nil {
				err = br.QueryRow().Scan(&gen, &n)
			}
			var tag pgconn.CommandTag
			if err == nil {
				tag, err = br.Exec()
			}
			if err == nil && tag.String() != "COMMIT" {
				err = errCommitRolledBack
			}
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("leasestore: ensure buckets: %w%s", err, migrateHint(err))
	}
	s.ensured = true
	s.noteBuckets(gen, n)
	s.viewMu.Lock()
	s.serving = [2]int{gen, n}
	s.viewMu.Unlock()
	return nil
}

// Serving returns the subscription's serving generation and its bucket
// count as this store last read them ([Store.EnsureBuckets], a pass): what
// the database says, whatever Config.Buckets says. Before either has run
// it returns (0, Config.Buckets).
func (s *Store) Serving() (generation, buckets int) {
	s.viewMu.RLock()
	defer s.viewMu.RUnlock()
	if s.serving[1] == 0 {
		return 0, s.cfg.Buckets
	}
	return s.serving[0], s.serving[1]
}

// noteBuckets logs once, at Warn, that the database's bucket count differs
// from Config.Buckets. Under opMu.
func (s *Store) noteBuckets(generation, n int) {
	if n == s.cfg.Buckets || s.warned {
		return
	}
	s.warned = true
	s.log.Warn(fmt.Sprintf("kumi: the database's bucket count rules: subscription %q has %d buckets (generation %d); "+
		"Config.Buckets = %d only applies when a subscription is created. Set it to %d to silence this.",
		s.cfg.Subscription, n, generation, s.cfg.Buckets, n),
		"configured", s.cfg.Buckets, "database", n, "generation", generation)
}

// EnsureHeld reports whether this worker may still act on bucket outside
// the database (a fenced write needs no such check). It returns an error
// wrapping [ErrNotHeld] when the bucket is not in the view, when a fence
// found it gone, or — KindRow and KindSession alike — once the last renewal
// that extended it STARTED TTL-Margin ago or more by the Clock (by its
// monotonic reading or its boot clock, whichever says older, so that a host
// suspended past the margin fails on resume): its expiry is then at most
// Margin away. KindSession also asks its session whether it
// still holds its lock, by a check that starts after the call, and fails
// if it cannot tell within one Heartbeat, or if the session was replaced
// since the last pass confirmed the bucket. A check that answers late is
// not cancelled (that would close the session's connection and release its
// lock): it goes on, and only a real failure ends the session.
func (s *Store) EnsureHeld(bucket int) error {
	if err := s.running(); err != nil {
		return err
	}
	s.viewMu.RLock()
	h, ok := s.view[bucket]
	s.viewMu.RUnlock()
	switch {
	case !ok:
		return fmt.Errorf("leasestore: bucket %d: not held by worker %s: %w", bucket, s.cfg.Worker, ErrNotHeld)
	case h.fenced:
		return fmt.Errorf("leasestore: bucket %d: a fenced write found it taken: %w", bucket, ErrNotHeld)
	}
	if err := s.fresh(bucket, h); err != nil {
		return err
	}
	if s.session != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Heartbeat)
		defer cancel()
		_, gen, err := s.session.check(ctx)
		if err != nil {
			return fmt.Errorf("leasestore: bucket %d: %v: %w", bucket, err, ErrNotHeld)
		}
		if gen != h.gen {
			// The session was replaced since the lease was last confirmed:
			// others may have taken it meanwhile. The next pass tells.
			return fmt.Errorf("leasestore: bucket %d: not yet confirmed under the new session: %w", bucket, ErrNotHeld)
		}
		// The answer must hold when it is given: the process may have
		// paused (SIGSTOP, GC, a starved CPU) while the session answered.
		return s.fresh(bucket, h)
	}
	return nil
}

// fresh fails once h's last renewal started TTL-Margin ago or more.
func (s *Store) fresh(bucket int, h heldLease) error {
	if now := readClock(s.cfg.clock); !renewalFresh(h.renewed, now, s.usable) {
		return fmt.Errorf("leasestore: bucket %d: its last renewal started %v ago (suspensions of the host "+
			"included), not under TTL-Margin (%v): %w", bucket, h.renewed.since(now), s.usable, ErrNotHeld)
	}
	return nil
}

// Held returns the leases this worker believes it holds, sorted by slot
// (those being handed off included), as of the last operation.
func (s *Store) Held() []Lease {
	s.viewMu.RLock()
	defer s.viewMu.RUnlock()
	out := make([]Lease, 0, len(s.view))
	for slot, h := range s.view {
		out = append(out, h.lease(slot))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slot < out[j].Slot })
	return out
}

// forget removes buckets from the view before they are given up, so that
// EnsureHeld fails for them from this moment on.
func (s *Store) forget(buckets ...int) map[int]heldLease {
	s.viewMu.Lock()
	defer s.viewMu.Unlock()
	gone := map[int]heldLease{}
	for _, b := range buckets {
		if h, ok := s.view[b]; ok {
			gone[b] = h
			delete(s.view, b)
		}
	}
	return gone
}

// FairShare is the number of buckets each of live workers should hold:
// ceil(n / live), with live below one counted as one.
func FairShare(n, live int) int {
	if live < 1 {
		live = 1
	}
	return (n + live - 1) / live
}
