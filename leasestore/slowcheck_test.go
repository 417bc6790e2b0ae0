package leasestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestASlowSessionCheckKeepsTheSession: a session check that outlives its
// caller's wait — EnsureHeld's heartbeat, a pass's bound — is a no for that
// caller, and must not close the session's connection. pgx closes a
// connection to cancel a statement in flight, and closing the session's
// releases its lock: every reader of the worker would go unsure at once,
// and every other worker's next pass would take all of its buckets as a
// dead worker's (EvidenceSessionGone), for a check that was merely late.
func TestASlowSessionCheckKeepsTheSession(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		late func(t *testing.T, a *Store) // asks the session, and gets no answer in time
	}{
		{"EnsureHeld", func(t *testing.T, a *Store) {
			err := a.EnsureHeld(0)
			require.ErrorIs(t, err, ErrNotHeld, "no answer within the heartbeat is a no")
		}},
		{"Pass", func(t *testing.T, a *Store) {
			_, err := a.Pass(context.Background())
			require.ErrorIs(t, err, context.DeadlineExceeded, "the pass is abandoned at its bound")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := b.config(KindSession, 4, "a")
			cfg.Heartbeat = time.Second // EnsureHeld's wait and the pass's first bound
			a := b.open(t, cfg)
			require.Len(t, pass(t, a).Owned, 4)
			heldEventually(t, a)
			pid, gen := sessionState(a)

			slow, release := slowNextCheck(t, a)
			c.late(t, a)
			// The check waits on the server, or its connection was closed
			// (pgx cancels the statement and ends the backend): the lock is
			// gone.
			eventually(t, 30*time.Second, func() bool {
				return waitsFor(t, b, pid, slow) || lockHolder(t, b, a.session.key) != pid
			}, func() string {
				return fmt.Sprintf("the session's backend %d neither waits for the test's lock nor lost the session lock", pid)
			})
			release()
			// The slow check ends: it answers, or the session is gone.
			eventually(t, 30*time.Second, func() bool { return a.EnsureHeld(0) == nil || lockHolder(t, b, a.session.key) != pid },
				func() string { return fmt.Sprintf("EnsureHeld: %v", a.EnsureHeld(0)) })

			rival := b.open(t, b.config(KindSession, 4, "b"))
			res := pass(t, rival)
			require.Equal(t, pid, lockHolder(t, b, a.session.key),
				"the session lock must still be held by the session's backend (0: by nobody); EnsureHeld: %v; "+
					"the rival's takeovers: %+v", a.EnsureHeld(0), res.Takeovers)
			require.Empty(t, res.Takeovers, "a rival took the buckets of a live worker")
			require.Empty(t, res.Claimed)
			heldEventually(t, a)
			nowPID, nowGen := sessionState(a)
			require.Equal(t, [2]uint64{uint64(pid), gen}, [2]uint64{uint64(nowPID), nowGen}, "the session was not reopened")

			after := pass(t, a)
			require.Empty(t, after.Lost)
			require.Len(t, after.Owned, 4)
			nowPID, nowGen = sessionState(a)
			require.Equal(t, [2]uint64{uint64(pid), gen}, [2]uint64{uint64(nowPID), nowGen}, "the session was not reopened")
			owner, _ := ownership(t, a)
			for bucket := range 4 {
				require.Equal(t, "a", owner[bucket], "bucket %d", bucket)
			}
		})
	}
}

// TestStopEndsASessionCheckLeftRunning: a session check that outlived its
// caller's wait goes on in a goroutine of its own; the store's Stop ends it
// (goleak, in TestMain, would find it otherwise) and closes the session.
func TestStopEndsASessionCheckLeftRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(KindSession, 2, "a")
	cfg.Heartbeat = time.Second
	a := b.open(t, cfg)
	require.Len(t, pass(t, a).Owned, 2)
	pid, _ := sessionState(a)
	slow, _ := slowNextCheck(t, a) // released only when the test ends
	require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld)
	eventually(t, 30*time.Second, func() bool { return waitsFor(t, b, pid, slow) },
		func() string { return fmt.Sprintf("the session's backend %d never waited for the test's lock", pid) })
	require.NoError(t, a.Stop(context.Background()))
	a.session.mu.Lock()
	pending := a.session.next
	a.session.mu.Unlock()
	require.Nil(t, pending, "no check is left to start")
	eventually(t, 30*time.Second, func() bool { return lockHolder(t, b, a.session.key) == 0 },
		func() string {
			return fmt.Sprintf("the session lock is still held by %d", lockHolder(t, b, a.session.key))
		})
	require.ErrorIs(t, a.EnsureHeld(0), ErrClosed)
}

// heldEventually waits until s.EnsureHeld(0) answers yes: on a loaded
// machine a check can take longer than the heartbeat it may wait.
func heldEventually(t *testing.T, s *Store) {
	t.Helper()
	eventually(t, 30*time.Second, func() bool { return s.EnsureHeld(0) == nil },
		func() string { return fmt.Sprintf("EnsureHeld: %v", s.EnsureHeld(0)) })
}

// slowNextCheck makes s's next session check slow on the server: before
// session_check, the session's connection waits there for an advisory lock
// (key) that the test holds in an open transaction, until release.
func slowNextCheck(t *testing.T, s *Store) (key int64, release func()) {
	t.Helper()
	ctx := context.Background()
	key = lockKey("slow check", s.cfg.Schema, s.cfg.Worker)
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key)
	require.NoError(t, err)
	release = sync.OnceFunc(func() { _ = tx.Rollback(context.Background()) })
	t.Cleanup(release)
	var once atomic.Bool
	setBeforeCheck(s, func(ctx context.Context, conn *pgx.Conn) error {
		if !once.CompareAndSwap(false, true) {
			return nil
		}
		_, err := conn.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1)", key)
		return err
	})
	return key, release
}

// advisoryLockWhere selects the advisory lock on key $1 (a bigint key).
const advisoryLockWhere = `locktype = 'advisory' AND objsubid = 1
	AND classid = ((($1::bigint) >> 32) & 4294967295)::oid AND objid = (($1::bigint) & 4294967295)::oid`

// waitsFor reports whether backend pid waits for the advisory lock key.
func waitsFor(t *testing.T, b *testBundle, pid int32, key int64) bool {
	t.Helper()
	var waiting bool
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND pid = $2 AND "+advisoryLockWhere+")",
		key, pid).Scan(&waiting))
	return waiting
}

// lockHolder returns the backend pid granted the advisory lock key, or 0.
func lockHolder(t *testing.T, b *testBundle, key int64) int32 {
	t.Helper()
	var pid int32
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT coalesce(max(pid), 0) FROM pg_locks WHERE granted AND "+advisoryLockWhere, key).Scan(&pid))
	return pid
}

// sessionState returns s's session's backend pid and generation.
func sessionState(s *Store) (int32, uint64) {
	_ = s.session.acquire(context.Background())
	defer s.session.release()
	return s.session.pid, s.session.gen
}

// setBeforeCheck sets s's session's beforeCheck.
func setBeforeCheck(s *Store, f func(ctx context.Context, conn *pgx.Conn) error) {
	_ = s.session.acquire(context.Background())
	defer s.session.release()
	s.session.beforeCheck = f
}

// TestASessionCheckAnswersOnlyCallersThatCameBeforeItStarted: callers share
// a session check (one answers all that ask at once), but only a check
// that started after a caller asked may answer it: a check already under
// way read the lock before the caller's question, and its yes could
// vouch for a moment the caller's delivery came after. Here the first
// check is held on the server; a second caller asks meanwhile, and the
// next check fails: the second caller must get that failure, not the
// first check's yes.
func TestASessionCheckAnswersOnlyCallersThatCameBeforeItStarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.open(t, b.config(KindSession, 2, "a"))
	require.Len(t, pass(t, a).Owned, 2)
	pid, _ := sessionState(a)
	ctx := context.Background()
	key := lockKey("answers after the call", a.cfg.Schema, a.cfg.Worker)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key)
	require.NoError(t, err)
	release := sync.OnceFunc(func() { _ = tx.Rollback(context.Background()) })
	t.Cleanup(release)
	errSecond := errors.New("test: the second check fails")
	var checks atomic.Int32
	setBeforeCheck(a, func(ctx context.Context, conn *pgx.Conn) error {
		switch checks.Add(1) {
		case 1:
			_, err := conn.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1)", key)
			return err
		case 2:
			return errSecond
		}
		return nil
	})

	type answer struct{ err error }
	ask := func() <-chan answer {
		out := make(chan answer, 1)
		go func() {
			c, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, _, err := a.session.check(c)
			out <- answer{err}
		}()
		return out
	}
	first := ask()
	eventually(t, 30*time.Second, func() bool { return waitsFor(t, b, pid, key) },
		func() string {
			return fmt.Sprintf("the first check (backend %d) never waited for the test's lock", pid)
		})
	second := ask()
	pending := func() bool {
		a.session.mu.Lock()
		defer a.session.mu.Unlock()
		return a.session.next != nil
	}
	eventually(t, 30*time.Second, pending, func() string { return "the second caller never joined a check" })
	release()
	require.NoError(t, (<-first).err, "the first check answers its caller")
	got := (<-second).err
	require.ErrorIs(t, got, errSecond, "the second caller asked while the first check ran: the next check answers it")
	require.Equal(t, int32(2), checks.Load(), "two checks ran")
}
