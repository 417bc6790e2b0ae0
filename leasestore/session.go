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

// session is one store's hold on a KindSession connection: the
// connection (sessionConn), and the store's key, the session advisory lock
// it holds on it for the worker's life. A store has a connection of its
// own unless its Config.Sessions shares one with the other stores of the
// process, each holding its own lock on it.
type session struct {
	*sessionConn
	key   int64
	bound time.Duration // how long a check of this store may run: TTL − Margin (see check)
	// member: the store's lock is among the connection's members (open
	// succeeded, close has not run). Under the turn.
	member bool
}

// sessionConn is KindSession's dedicated connection and the session
// advisory locks it holds. Other workers read a lock's absence as proof
// that its worker is gone, so nothing may close the connection but a real
// failure, the store's Stop (a connection of its own) or the Sessions'
// Close: pgx closes a connection to cancel a statement in flight, and the
// session's statements therefore never run under a caller's short context
// (see check).
type sessionConn struct {
	cfg    *pgx.ConnConfig
	key    int64 // the lock of the store that owns the connection; 0 when shared (see Sessions)
	stmt   statements
	pool   *pgxpool.Pool // the store's pool: the session must reach its server and database
	shared bool          // a Sessions' connection: a store's lock is taken and released on it alone

	// turn is held by whoever uses the connection (pgx.Conn is not safe
	// for concurrent use): one token, in a channel rather than a mutex so
	// that a waiter can give up. It guards conn, pid, gen, members, held
	// and beforeCheck.
	turn chan struct{}
	conn *pgx.Conn
	pid  int32
	gen  uint64 // grows with every lock taken (every session opened): leases confirmed under an older one are not vouched for
	// members are the locks the connection should hold, each with its
	// store's check bound; held the ones it took, each with the gen it was
	// taken under.
	members map[int64]time.Duration
	held    map[int64]uint64
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
	done chan struct{} // closed once pid, held and err are set
	pid  int32
	gen  uint64           // the connection's gen when the check began
	held map[int64]uint64 // the locks the check found held, with the gen each was taken under
	err  error
}

func newSessionConn(cfg *pgx.ConnConfig, st statements, pool *pgxpool.Pool, shared bool) *sessionConn {
	life, end := context.WithCancel(context.Background())
	return &sessionConn{cfg: cfg, stmt: st, pool: pool, shared: shared, turn: make(chan struct{}, 1),
		members: map[int64]time.Duration{}, held: map[int64]uint64{}, life: life, end: end}
}

// newSession is a store's session on a connection of its own.
func newSession(cfg *pgx.ConnConfig, key int64, st statements, pool *pgxpool.Pool, bound time.Duration) *session {
	c := newSessionConn(cfg, st, pool, false)
	c.key = key
	return &session{sessionConn: c, key: key, bound: bound}
}

// acquire takes the turn, or gives up when ctx ends.
func (ss *sessionConn) acquire(ctx context.Context) error {
	select {
	case ss.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ss *sessionConn) release() { <-ss.turn }

// errSessionStopped: the store stopped, and its session with it.
var errSessionStopped = errors.New("the session is closed (the store stopped)")

// errSessionLockHeld: another live session holds this worker's lock.
var errSessionLockHeld = errors.New("the session lock of this worker id is held by another session " +
	"(is another process running with the same Config.Worker?)")

// errSessionLockLost: the session's connection answers, without the
// store's lock.
var errSessionLockLost = errors.New("the session no longer holds its lock")

// open connects if the connection is not open, and takes the store's
// lock on it (see openLocked and take).
func (ss *session) open(ctx context.Context) error {
	if err := ss.acquire(ctx); err != nil {
		return err
	}
	defer ss.release()
	if _, dup := ss.members[ss.key]; dup && !ss.member {
		// Another store of this process holds the lock on this very
		// connection: an advisory lock is re-entrant within its session,
		// so pg_try_advisory_lock would grant it twice
		// (TestPoolerDetection/TheSameWorkerIdCannotHoldTwoSessions).
		return fmt.Errorf("leasestore: %w", errSessionLockHeld)
	}
	ss.members[ss.key] = ss.bound
	var err error
	if ss.shared && ss.alive() {
		err = ss.take(ctx, ss.conn, ss.key)
	} else {
		err = ss.openLocked(ctx, ss.key)
	}
	if err != nil {
		delete(ss.members, ss.key)
		delete(ss.held, ss.key)
		ss.member = false
		return err
	}
	ss.member = true
	return nil
}

// alive reports that the connection is open. Under the turn.
func (ss *sessionConn) alive() bool { return ss.conn != nil && !ss.conn.IsClosed() }

// take takes key's lock on conn. A rival's transaction-scoped probe of the
// lock (see confirm_dead) holds it for a moment, so a refusal is retried a
// few times before it is believed. Under the turn.
func (ss *sessionConn) take(ctx context.Context, conn *pgx.Conn, key int64) error {
	wait := 10 * time.Millisecond
	for attempt := 0; ; attempt++ {
		var ok bool
		var pid int32
		if err := conn.QueryRow(ctx, ss.stmt.get("session_lock"), key).Scan(&ok, &pid); err != nil {
			return fmt.Errorf("leasestore: take the session lock: %w", err)
		}
		if ok {
			ss.gen++
			ss.held[key] = ss.gen
			return nil
		}
		if attempt == 4 {
			return fmt.Errorf("leasestore: %w", errSessionLockHeld)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
			wait *= 2
		}
	}
}

// openLocked (re)opens the connection with the turn held: it connects,
// takes key's lock, checks that the pool sees it (see verify) and that
// the connection is its own (see pinned), then takes the other members'
// locks (a shared connection), leaving out one another session holds:
// its store's next check finds it missing. Its statements run under ctx:
// a connection it closes to cancel one was not yet the session, and
// nothing was vouched for under it (gen grows only once it is).
func (ss *sessionConn) openLocked(ctx context.Context, key int64) error {
	ss.closeLocked()
	if ss.life.Err() != nil {
		return errSessionStopped
	}
	conn, err := pgx.ConnectConfig(ctx, ss.cfg.Copy())
	if err != nil {
		return fmt.Errorf("leasestore: connect the session: %w", err)
	}
	if err := ss.take(ctx, conn, key); err != nil {
		_ = conn.Close(context.Background())
		clear(ss.held)
		return err
	}
	pid := int32(0)
	err = conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	if err == nil {
		err = ss.verify(ctx, conn, key, pid)
	}
	if err == nil {
		err = ss.pinned(ctx, conn, pid)
	}
	if err != nil {
		_ = conn.Close(context.Background()) // releases the lock
		clear(ss.held)
		return err
	}
	for k := range ss.members {
		if k == key {
			continue
		}
		if err := ss.take(ctx, conn, k); err != nil && !errors.Is(err, errSessionLockHeld) {
			_ = conn.Close(context.Background())
			clear(ss.held)
			return err
		}
	}
	ss.conn, ss.pid = conn, pid
	return nil
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
func (ss *sessionConn) verify(ctx context.Context, conn *pgx.Conn, key int64, pid int32) error {
	sess, err := ss.identify(ctx, conn, key, pid)
	if err != nil {
		return fmt.Errorf("leasestore: identify the session connection's server: %w", err)
	}
	pool, err := ss.identify(ctx, ss.pool, key, pid)
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
func (ss *sessionConn) pinned(ctx context.Context, conn *pgx.Conn, pid int32) error {
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
func (ss *sessionConn) identify(ctx context.Context, q queryRower, key int64, pid int32) (identity, error) {
	var id identity
	scan := func(name string) error {
		return q.QueryRow(ctx, ss.stmt.get(name), key, pid).Scan(&id.database, &id.standby, &id.seesLock, &id.system)
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

// check asks the session itself whether it still holds the store's
// lock, and returns its backend pid and the generation the lock was taken
// under. Any failure to answer counts as no, and so does no answer before
// ctx ends.
//
// The answer always comes from a check that started after check was
// called: callers join the round that has not started yet (one check
// answers them all, however many readers — and, on a shared connection,
// however many stores — ask at once: it checks every lock the connection
// holds in one statement), and a round stops taking callers once it holds
// the turn, before it sends its statement.
//
// A round runs in a goroutine of its own, under bound (TTL − Margin; the
// least of its stores' on a shared connection) and not under ctx: a
// statement cancelled in flight costs its connection, and the session's
// connection holds the lock. A check that is merely late — a loaded host,
// the turn held by other checks or a pass — is a no for the callers that
// stopped waiting, and goes on; only one that fails for real (the
// connection closed, the lock gone, another backend answering, or no
// answer within bound) has the next pass close or reopen the session.
// bound is TTL − Margin because an answer later than that vouches for
// nothing (every lease confirmed before the check started fails the margin
// rule by then) and it is the longest a pass may run (passBound): a
// session slower than that is as good as gone. The rounds end with stop.
func (ss *session) check(ctx context.Context) (int32, uint64, error) {
	_, pid, gen, err := ss.checkRound(ctx)
	return pid, gen, err
}

// checkRound is check, with the round that answered (nil if none did).
func (ss *session) checkRound(ctx context.Context) (*checkRound, int32, uint64, error) {
	r, err := ss.join()
	if err != nil {
		return nil, 0, 0, err
	}
	select {
	case <-r.done:
		if r.err != nil {
			return r, r.pid, 0, r.err
		}
		gen, ok := r.held[ss.key]
		if !ok {
			return r, r.pid, 0, errSessionLockLost
		}
		return r, r.pid, gen, nil
	case <-ctx.Done():
		return nil, 0, 0, fmt.Errorf("the session did not answer in time (its check goes on): %w", ctx.Err())
	}
}

// join returns the round that has not started yet, starting one if none.
func (ss *sessionConn) join() (*checkRound, error) {
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
func (ss *sessionConn) run(r *checkRound) {
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
	bound := time.Duration(0)
	for _, b := range ss.members {
		if bound == 0 || b < bound {
			bound = b
		}
	}
	if bound == 0 {
		bound = time.Second // no member: nobody waits for the answer
	}
	ctx, cancel := context.WithTimeout(ss.life, bound)
	defer cancel()
	r.pid, r.gen = ss.pid, ss.gen
	r.held, r.err = ss.checkLocked(ctx)
}

// checkLocked asks the connection which of its locks it holds.
func (ss *sessionConn) checkLocked(ctx context.Context) (map[int64]uint64, error) {
	if !ss.alive() {
		return nil, errors.New("the session connection is closed")
	}
	if ss.beforeCheck != nil {
		if err := ss.beforeCheck(ctx, ss.conn); err != nil {
			return nil, fmt.Errorf("the session did not answer: %w", err)
		}
	}
	keys := make([]int64, 0, len(ss.held))
	for k := range ss.held {
		keys = append(keys, k)
	}
	var found []int64
	var pid int32
	if err := ss.conn.QueryRow(ctx, ss.stmt.get("session_check"), keys).Scan(&found, &pid); err != nil {
		return nil, fmt.Errorf("the session did not answer: %w", err)
	}
	if pid != ss.pid {
		return nil, &SessionPoolerError{Evidence: fmt.Sprintf(
			"the session's statements ran on two server connections, backend pids %d and %d", ss.pid, pid)}
	}
	held := make(map[int64]uint64, len(found))
	for _, k := range found {
		held[k] = ss.held[k]
	}
	for k := range ss.held {
		if _, ok := held[k]; !ok {
			delete(ss.held, k) // lost: the store's next pass takes it again, under a new gen
		}
	}
	return held, nil
}

// ensure checks the session (see check) and, when it failed for real,
// opens a new one — on a shared connection that still answers, it only
// takes the store's lost lock again. It returns the backend pid and the
// generation of the live session's lock. A check that does not answer
// before ctx ends leaves the session alone: its check goes on, and the
// next pass asks again.
func (ss *session) ensure(ctx context.Context) (int32, uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err // the caller gave up: leave the session alone
	}
	r, pid, gen, err := ss.checkRound(ctx)
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
	if g, taken := ss.held[ss.key]; taken && ss.alive() && r != nil && g > r.gen {
		// Another store's ensure reopened the connection, taking this
		// lock again, since the check began.
		return ss.pid, ss.held[ss.key], nil
	}
	if ss.shared && ss.alive() && errors.Is(err, errSessionLockLost) {
		if err := ss.take(ctx, ss.conn, ss.key); err != nil {
			return 0, 0, err
		}
		return ss.pid, ss.held[ss.key], nil
	}
	if err := ss.openLocked(ctx, ss.key); err != nil {
		return 0, 0, err
	}
	return ss.pid, ss.held[ss.key], nil
}

// backendPID is the pid of the current session's backend (0 if none).
func (ss *sessionConn) backendPID() int32 {
	_ = ss.acquire(context.Background())
	defer ss.release()
	if ss.conn == nil {
		return 0
	}
	return ss.pid
}

// close releases the store's lock: on a connection of its own (or a
// shared one it was the last store of) by closing it; on a shared one by
// unlocking it, or, if that fails, by closing the connection (the other
// stores' next checks find it gone and reopen). The session may open
// again (a failed Start undoes itself so).
func (ss *session) close() {
	_ = ss.acquire(context.Background())
	defer ss.release()
	if !ss.member {
		if !ss.shared {
			ss.closeLocked() // a connection of its own: nobody else's lock is on it
		}
		return // shared: never opened, or closed; the key may be another store's
	}
	ss.member = false
	delete(ss.members, ss.key)
	_, taken := ss.held[ss.key]
	delete(ss.held, ss.key)
	if !ss.shared || len(ss.members) == 0 {
		ss.closeLocked()
		return
	}
	if !taken || !ss.alive() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var unlocked bool
	if err := ss.conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", ss.key).Scan(&unlocked); err != nil || !unlocked {
		ss.closeLocked()
	}
}

// stop ends the store's session for good (the store's Stop). A connection
// of its own ends: the checks still running end (a statement in flight is
// cancelled, closing the connection it ran on: the session is closing
// anyway), none starts any more, and the connection is closed. On a
// shared connection the store's lock is released (see close); the
// connection ends with its Sessions' Close.
func (ss *session) stop() {
	if ss.shared {
		ss.close()
		return
	}
	ss.stopConn()
}

// stopConn ends the connection for good.
func (ss *sessionConn) stopConn() {
	ss.mu.Lock()
	ss.stopped = true
	ss.mu.Unlock()
	ss.end()
	ss.rounds.Wait()
	_ = ss.acquire(context.Background())
	defer ss.release()
	clear(ss.members)
	ss.closeLocked()
}

func (ss *sessionConn) closeLocked() {
	clear(ss.held)
	if ss.conn != nil {
		// Closing the session releases its locks: to the others, its
		// workers are gone.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = ss.conn.Close(ctx)
		cancel()
		ss.conn, ss.pid = nil, 0
	}
}

// Sessions is one KindSession connection shared by the stores of a
// process (Config.Sessions): each store holds its own session advisory
// lock, one per (subscription, worker), on it, so K session-kind
// subscriptions cost one connection, not K, and one check statement per
// round however many stores ask. Its checks, reopenings, the pooler and
// server checks and what other workers read from a lock are a store's own
// session's; a store's Stop unlocks its lock alone (closing the
// connection only if that fails: the other stores then reopen it and take
// theirs again, and their leases are not vouched for until a pass
// confirms them under the new session). The connection opens with the
// first store's Start and closes when the last store stops, or with
// [Sessions.Close]. Its methods are safe for concurrent use.
type Sessions struct {
	c      *sessionConn
	schema string
}

// NewSessions returns a shared session connection for the stores on pool
// of the lease tables in schema (schema must be the stores' Config.Schema,
// "" for the default). sessionURL is as Config.SessionURL ("" connects
// with pool's settings); the stores' own Config.SessionURL is then
// ignored. It makes no connection.
func NewSessions(pool *pgxpool.Pool, schema, sessionURL string) (*Sessions, error) {
	if pool == nil {
		return nil, errors.New("leasestore: NewSessions needs a pool")
	}
	if schema == "" {
		schema = Config{}.WithDefaults().Schema
	}
	cc, err := sessionConfig(sessionURL, pool.Config().ConnConfig)
	if err != nil {
		return nil, err
	}
	return &Sessions{c: newSessionConn(cc, renderStatements(schema), pool, true), schema: schema}, nil
}

// Close closes the connection, which releases every lock still on it:
// call it once the stores that share it have stopped. It is idempotent.
func (s *Sessions) Close() { s.c.stopConn() }

// BackendPID is the shared connection's backend pid, 0 when it is not open.
func (s *Sessions) BackendPID() int { return int(s.c.backendPID()) }
