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
// lock it holds for the worker's life. Other workers read the lock's
// absence as proof that this worker is gone, so nothing may close the
// connection but a real failure or the store's Stop: pgx closes a
// connection to cancel a statement in flight, and the session's statements
// therefore never run under a caller's short context (see check).
type session struct {
	cfg   *pgx.ConnConfig
	key   int64
	stmt  statements
	pool  *pgxpool.Pool // the store's pool: the session must reach its server and database
	bound time.Duration // how long a check may run: TTL − Margin (see check)

	// turn is held by whoever uses the connection (pgx.Conn is not safe
	// for concurrent use): one token, in a channel rather than a mutex so
	// that a waiter can give up. It guards conn, pid, gen and beforeCheck.
	turn chan struct{}
	conn *pgx.Conn
	pid  int32
	gen  uint64 // grows with every session opened: leases confirmed under an older one are not vouched for
	// beforeCheck, when a test sets it, runs on the connection just before
	// session_check, under the check's context: a statement it runs is a
	// slow check on the server.
	beforeCheck func(ctx context.Context, conn *pgx.Conn) error

	life context.Context // ends with stop: the checks still running end with it
	end  context.CancelFunc

	mu      sync.Mutex     // guards next and stopped
	next    *checkRound    // the check that callers join: not started yet
	stopped bool           // stop began: no check starts any more
	rounds  sync.WaitGroup // the checks' goroutines
}

// checkRound is one session check and the callers waiting for its answer,
// all of whom joined before it started.
type checkRound struct {
	done chan struct{} // closed once pid, gen and err are set
	pid  int32
	gen  uint64
	err  error
}

func newSession(cfg *pgx.ConnConfig, key int64, st statements, pool *pgxpool.Pool, bound time.Duration) *session {
	life, end := context.WithCancel(context.Background())
	return &session{cfg: cfg, key: key, stmt: st, pool: pool, bound: bound, turn: make(chan struct{}, 1),
		life: life, end: end}
}

// acquire takes the turn, or gives up when ctx ends.
func (ss *session) acquire(ctx context.Context) error {
	select {
	case ss.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ss *session) release() { <-ss.turn }

// errSessionStopped: the store stopped, and its session with it.
var errSessionStopped = errors.New("the session is closed (the store stopped)")

// errSessionLockHeld: another live session holds this worker's lock.
var errSessionLockHeld = errors.New("the session lock of this worker id is held by another session " +
	"(is another process running with the same Config.Worker?)")

// open connects, takes the lock and checks that the pool sees it (see
// verify). A rival's transaction-scoped probe of the lock (see
// confirm_dead) holds it for a moment, so a refusal is retried a few times
// before it is believed.
func (ss *session) open(ctx context.Context) error {
	if err := ss.acquire(ctx); err != nil {
		return err
	}
	defer ss.release()
	return ss.openLocked(ctx)
}

// openLocked is open with the turn held. Its statements run under ctx: a
// connection it closes to cancel one was not yet the session, and nothing
// was vouched for under it (gen grows only once it is).
func (ss *session) openLocked(ctx context.Context) error {
	ss.closeLocked()
	if ss.life.Err() != nil {
		return errSessionStopped
	}
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
// returns its backend pid and generation. Any failure to answer counts as
// no, and so does no answer before ctx ends.
//
// The answer always comes from a check that started after check was
// called: callers join the round that has not started yet (one check
// answers them all, however many readers ask at once), and a round stops
// taking callers once it holds the turn, before it sends its statement.
//
// A round runs in a goroutine of its own, under bound (TTL − Margin) and
// not under ctx: a statement cancelled in flight costs its connection, and
// the session's connection holds the lock. A check that is merely late —
// a loaded host, the turn held by other checks or a pass — is a no for the
// callers that stopped waiting, and goes on; only one that fails for real
// (the connection closed, the lock gone, another backend answering, or no
// answer within bound) has the next pass close or reopen the session.
// bound is TTL − Margin because an answer later than that vouches for
// nothing (every lease confirmed before the check started fails the margin
// rule by then) and it is the longest a pass may run (passBound): a
// session slower than that is as good as gone. The rounds end with stop.
func (ss *session) check(ctx context.Context) (int32, uint64, error) {
	r, err := ss.join()
	if err != nil {
		return 0, 0, err
	}
	select {
	case <-r.done:
		return r.pid, r.gen, r.err
	case <-ctx.Done():
		return 0, 0, fmt.Errorf("the session did not answer in time (its check goes on): %w", ctx.Err())
	}
}

// join returns the round that has not started yet, starting one if none.
func (ss *session) join() (*checkRound, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.stopped {
		return nil, errSessionStopped
	}
	if ss.next == nil {
		ss.next = &checkRound{done: make(chan struct{})}
		ss.rounds.Add(1)
		go ss.run(ss.next)
	}
	return ss.next, nil
}

// run runs round r: it takes the turn, stops r taking callers, and checks.
func (ss *session) run(r *checkRound) {
	defer ss.rounds.Done()
	defer close(r.done)
	err := ss.acquire(ss.life)
	ss.mu.Lock()
	if ss.next == r {
		ss.next = nil // who asks from now on is answered by a check that starts later
	}
	ss.mu.Unlock()
	if err != nil {
		r.err = errSessionStopped
		return
	}
	defer ss.release()
	ctx, cancel := context.WithTimeout(ss.life, ss.bound)
	defer cancel()
	r.pid, r.gen = ss.pid, ss.gen
	r.err = ss.checkLocked(ctx)
}

func (ss *session) checkLocked(ctx context.Context) error {
	if ss.conn == nil || ss.conn.IsClosed() {
		return errors.New("the session connection is closed")
	}
	if ss.beforeCheck != nil {
		if err := ss.beforeCheck(ctx, ss.conn); err != nil {
			return fmt.Errorf("the session did not answer: %w", err)
		}
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

// ensure checks the session (see check) and, when it failed for real,
// opens a new one. It returns the backend pid and the generation of the
// live session. A check that does not answer before ctx ends leaves the
// session alone: its check goes on, and the next pass asks again.
func (ss *session) ensure(ctx context.Context) (int32, uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err // the caller gave up: leave the session alone
	}
	pid, gen, err := ss.check(ctx)
	if err == nil {
		return pid, gen, nil
	}
	if ctx.Err() != nil {
		return 0, 0, err
	}
	if err := ss.acquire(ctx); err != nil {
		return 0, 0, err
	}
	defer ss.release()
	var pe *SessionPoolerError
	if errors.As(err, &pe) {
		// Reopening through the same pooler would only find the lock
		// held by the backend that took it.
		ss.closeLocked()
		return 0, 0, fmt.Errorf("leasestore: %w", err)
	}
	if err := ss.openLocked(ctx); err != nil {
		return 0, 0, err
	}
	return ss.pid, ss.gen, nil
}

// backendPID is the pid of the current session's backend (0 if none).
func (ss *session) backendPID() int32 {
	_ = ss.acquire(context.Background())
	defer ss.release()
	if ss.conn == nil {
		return 0
	}
	return ss.pid
}

// close closes the connection, which releases the lock; the session may
// open again (a failed Start undoes itself so).
func (ss *session) close() {
	_ = ss.acquire(context.Background())
	defer ss.release()
	ss.closeLocked()
}

// stop ends the session for good (the store's Stop): the checks still
// running end (a statement in flight is cancelled, closing the connection
// it ran on: the session is closing anyway), none starts any more, and the
// connection is closed.
func (ss *session) stop() {
	ss.mu.Lock()
	ss.stopped = true
	ss.mu.Unlock()
	ss.end()
	ss.rounds.Wait()
	ss.close()
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
