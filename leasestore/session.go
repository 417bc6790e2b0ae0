package leasestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// session is KindSession's dedicated connection and the session advisory
// lock it holds for the worker's whole life. Other workers read the lock's
// absence as proof that this worker is gone. pgx.Conn is not safe for
// concurrent use, so every use goes through mu.
type session struct {
	cfg  *pgx.ConnConfig
	key  int64
	stmt statements

	mu   sync.Mutex
	conn *pgx.Conn
	pid  int32
	gen  uint64 // grows with every session opened: leases confirmed under an older one are not vouched for
}

func newSession(cfg *pgx.ConnConfig, key int64, st statements) *session {
	return &session{cfg: cfg, key: key, stmt: st}
}

// errSessionLockHeld: another live session holds this worker's lock.
var errSessionLockHeld = errors.New("the session lock of this worker id is held by another session " +
	"(is another process running with the same Config.Worker?)")

// open connects and takes the lock. A rival's transaction-scoped probe of
// the lock (see confirm_dead) holds it for a moment, so a refusal is retried
// a few times before it is believed.
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
	if err := ss.conn.QueryRow(ctx, ss.stmt.get("session_check"), ss.key).Scan(&held); err != nil {
		return fmt.Errorf("the session did not answer: %w", err)
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
