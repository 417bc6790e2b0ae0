package leasestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// session is KindSession's dedicated connection and the session advisory
// lock it holds for the worker's whole life. Other workers read the lock's
// absence as proof that this worker is gone. pgx.Conn is not safe for
// concurrent use, so every use goes through mu.
type session struct {
	cfg  *pgx.ConnConfig
	key  int64
	stmt statements
	pool *pgxpool.Pool // the store's pool: the session must reach its server and database

	mu   sync.Mutex
	conn *pgx.Conn
	pid  int32
	gen  uint64 // grows with every session opened: leases confirmed under an older one are not vouched for
}

func newSession(cfg *pgx.ConnConfig, key int64, st statements, pool *pgxpool.Pool) *session {
	return &session{cfg: cfg, key: key, stmt: st, pool: pool}
}

// errSessionLockHeld: another live session holds this worker's lock.
var errSessionLockHeld = errors.New("the session lock of this worker id is held by another session " +
	"(is another process running with the same Config.Worker?)")

// open connects, takes the lock and checks that the pool sees it (see
// verify). A rival's transaction-scoped probe of the lock (see
// confirm_dead) holds it for a moment, so a refusal is retried a few times
// before it is believed.
func (ss *session) open(ctx context.Context) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.openLocked(ctx)
}

func (ss *session) openLocked(ctx context.Context) error {
	ss.closeLocked()
	conn, err := pgx.ConnectConfig(ctx, ss.cfg.Copy())
	if err != nil {
		return fmt.Errorf("leasestore: connect the session: %w", err)
	}
	wait := 10 * time.Millisecond
	for attempt := 0; ; attempt++ {
		var ok bool
		var pid int32
		if err := conn.QueryRow(ctx, ss.stmt.get("session_lock"), ss.key).Scan(&ok, &pid); err != nil {
			_ = conn.Close(context.Background())
			return fmt.Errorf("leasestore: take the session lock: %w", err)
		}
		if ok {
			err := ss.verify(ctx, conn, pid)
			if err == nil {
				err = ss.pinned(ctx, conn, pid)
			}
			if err != nil {
				_ = conn.Close(context.Background()) // releases the lock
				return err
			}
			ss.conn, ss.pid = conn, pid
			ss.gen++
			return nil
		}
		if attempt == 4 {
			_ = conn.Close(context.Background())
			return fmt.Errorf("leasestore: %w", errSessionLockHeld)
		}
		select {
		case <-ctx.Done():
			_ = conn.Close(context.Background())
			return ctx.Err()
		case <-time.After(wait):
			wait *= 2
		}
	}
}

// identity is where a connection is, as session_identity reads it.
type identity struct {
	database string
	standby  bool
	seesLock bool   // it sees the session's lock granted to the session's backend in its database
	system   string // the system identifier; "" when the role may not read it
}

// verify checks that the session connection conn (backend pid, holding the
// lock) and the pool reach the same server and database, both a primary:
// what other workers conclude from the lock — workers_view's pg_locks read
// and confirm_dead's pg_try_advisory_xact_lock, both on the pool, both per
// database and per server — holds only then. The decisive check is that
// the pool sees the lock granted to that backend in its own database; the
// system identifier, the database names and the recovery states name the
// mismatch. Nothing in the error comes from the URL.
func (ss *session) verify(ctx context.Context, conn *pgx.Conn, pid int32) error {
	sess, err := ss.identify(ctx, conn, pid)
	if err != nil {
		return fmt.Errorf("leasestore: identify the session connection's server: %w", err)
	}
	pool, err := ss.identify(ctx, ss.pool, pid)
	if err != nil {
		return fmt.Errorf("leasestore: identify the pool's server: %w", err)
	}
	return compareIdentities(sess, pool)
}

// pinned checks, by what the connections do rather than what the URL looks
// like, that the session's server connection is its own: a transaction
// pooler gives it back to the pool between statements. A probe connection
// with the session's config opens a transaction — a transaction pooler
// hands it the most recently released server connection, the one whose
// backend (pid) just took the lock — and, while the probe holds its server
// connection, the session asks again which backend serves it. A direct
// connection and a session pooler give the probe a backend of its own and
// the session the same one. Either sign of pooling is a
// *SessionPoolerError. A pooler that happens to pass (round robin, a busy
// pool) is probed again whenever the session reopens, which it does as
// soon as a statement lands on another backend (session_check).
func (ss *session) pinned(ctx context.Context, conn *pgx.Conn, pid int32) error {
	probe, err := pgx.ConnectConfig(ctx, ss.cfg.Copy())
	if err != nil {
		return fmt.Errorf("leasestore: connect the session's probe: %w", err)
	}
	defer func() { _ = probe.Close(context.Background()) }()
	tx, err := probe.Begin(ctx)
	if err != nil {
		return fmt.Errorf("leasestore: probe the session's connection: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var probePID, again int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&probePID); err != nil {
		return fmt.Errorf("leasestore: probe the session's connection: %w", err)
	}
	if probePID == pid {
		return &SessionPoolerError{Evidence: fmt.Sprintf(
			"another client's transaction ran on the server connection that holds the session lock, backend pid %d", pid)}
	}
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&again); err != nil {
		return fmt.Errorf("leasestore: probe the session's connection: %w", err)
	}
	if again != pid {
		return &SessionPoolerError{Evidence: fmt.Sprintf(
			"the session's statements ran on two server connections, backend pids %d and %d", pid, again)}
	}
	return nil
}

// queryRower is a *pgx.Conn or a *pgxpool.Pool.
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// identify reads q's identity. A role without EXECUTE on pg_control_system
// (revoked by some hosted services) reads it without the system
// identifier; the lock check then tells servers apart.
func (ss *session) identify(ctx context.Context, q queryRower, pid int32) (identity, error) {
	var id identity
	scan := func(name string) error {
		return q.QueryRow(ctx, ss.stmt.get(name), ss.key, pid).Scan(&id.database, &id.standby, &id.seesLock, &id.system)
	}
	err := scan("session_identity")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		err = scan("session_identity_plain")
	}
	return id, err
}

// compareIdentities returns a *SessionMismatchError naming the first
// difference between the session's identity and the pool's, or nil.
func compareIdentities(sess, pool identity) error {
	mismatch := func(what SessionMismatch, s, p string) error {
		return &SessionMismatchError{Mismatch: what, Session: s, Pool: p}
	}
	role := func(standby bool) string {
		if standby {
			return "a standby (in recovery)"
		}
		return "a primary"
	}
	switch {
	case sess.standby || pool.standby:
		return mismatch(MismatchStandby, role(sess.standby), role(pool.standby))
	case sess.system != "" && pool.system != "" && sess.system != pool.system:
		return mismatch(MismatchServer, "system identifier "+sess.system, "system identifier "+pool.system)
	case sess.database != pool.database:
		return mismatch(MismatchDatabase, fmt.Sprintf("database %q", sess.database), fmt.Sprintf("database %q", pool.database))
	case !pool.seesLock:
		return mismatch(MismatchLock, fmt.Sprintf("database %q and holds its lock", sess.database),
			fmt.Sprintf("database %q but does not see that lock (another server, or a proxy routing the two apart)",
				pool.database))
	}
	return nil
}

// check asks the session itself whether it still holds its lock, and
// returns its generation. Any failure to answer counts as no.
func (ss *session) check(ctx context.Context) (uint64, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.gen, ss.checkLocked(ctx)
}

func (ss *session) checkLocked(ctx context.Context) error {
	if ss.conn == nil || ss.conn.IsClosed() {
		return errors.New("the session connection is closed")
	}
	var held bool
	var pid int32
	if err := ss.conn.QueryRow(ctx, ss.stmt.get("session_check"), ss.key).Scan(&held, &pid); err != nil {
		return fmt.Errorf("the session did not answer: %w", err)
	}
	if pid != ss.pid {
		return &SessionPoolerError{Evidence: fmt.Sprintf(
			"the session's statements ran on two server connections, backend pids %d and %d", ss.pid, pid)}
	}
	if !held {
		return errors.New("the session no longer holds its lock")
	}
	return nil
}

// ensure checks the session and, when it is gone, opens a new one. It
// returns the backend pid and the generation of the live session.
func (ss *session) ensure(ctx context.Context) (int32, uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err // the caller gave up: leave the session alone
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if err := ss.checkLocked(ctx); err != nil {
		var pe *SessionPoolerError
		if errors.As(err, &pe) {
			// Reopening through the same pooler would only find the lock
			// held by the backend that took it.
			ss.closeLocked()
			return 0, 0, fmt.Errorf("leasestore: %w", err)
		}
		if ctx.Err() != nil {
			return 0, 0, err
		}
		if err := ss.openLocked(ctx); err != nil {
			return 0, 0, err
		}
	}
	return ss.pid, ss.gen, nil
}

// backendPID is the pid of the current session's backend (0 if none).
func (ss *session) backendPID() int32 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.conn == nil {
		return 0
	}
	return ss.pid
}

func (ss *session) close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.closeLocked()
}

func (ss *session) closeLocked() {
	if ss.conn != nil {
		// Closing the session releases the lock: to the others, this worker
		// is gone.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = ss.conn.Close(ctx)
		cancel()
		ss.conn, ss.pid = nil, 0
	}
}
