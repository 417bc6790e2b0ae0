package leasestore

import (
	"errors"
	"fmt"

	"github.com/kumi-run/kumi/eventsource"
)

// ErrNotHeld reports that this worker may not act on a bucket: it does not
// hold it, or cannot prove that it still does (see [Store.EnsureHeld]).
var ErrNotHeld = errors.New("leasestore: bucket not held")

// ErrClosed is returned by the methods of a [Store] once [Store.Stop] has
// been called.
var ErrClosed = errors.New("leasestore: store closed")

// LostFenceError is returned by a fence's Check and by [Store.Guard] when
// the writer no longer holds the bucket at the epoch it was granted: the
// write must not land, and the worker must stop working on the bucket. It
// wraps [eventsource.ErrFenceLost].
type LostFenceError struct {
	Subscription string // the lease's subscription
	Bucket       int    // the bucket written
	Worker       string // the writer
	Epoch        int64  // the epoch the writer was granted
	Owner        string // the owner now; "" when free or when there is no row
	FoundEpoch   int64  // the epoch now; -1 when there is no row
}

// Error names the bucket, the epoch the writer held and who holds it now.
func (e *LostFenceError) Error() string {
	now := fmt.Sprintf("owner %q at epoch %d", e.Owner, e.FoundEpoch)
	switch {
	case e.FoundEpoch < 0:
		now = "no lease row (was EnsureBuckets run?)"
	case e.Owner == "":
		now = fmt.Sprintf("free at epoch %d", e.FoundEpoch)
	}
	return fmt.Sprintf("leasestore: subscription %q bucket %d: worker %q lost its lease at epoch %d (now %s): %v",
		e.Subscription, e.Bucket, e.Worker, e.Epoch, now, eventsource.ErrFenceLost)
}

// Unwrap returns [eventsource.ErrFenceLost].
func (e *LostFenceError) Unwrap() error { return eventsource.ErrFenceLost }

// SessionMismatch names what differs between KindSession's dedicated
// connection and the pool, in [SessionMismatchError.Mismatch].
type SessionMismatch string

const (
	// MismatchServer: the two connections reach different PostgreSQL
	// clusters (their system identifiers differ).
	MismatchServer SessionMismatch = "server"
	// MismatchDatabase: they reach different databases of one server.
	MismatchDatabase SessionMismatch = "database"
	// MismatchStandby: one of them reaches a server in recovery (a
	// standby), whose locks the primary does not see.
	MismatchStandby SessionMismatch = "standby"
	// MismatchLock: the pool does not see the session's advisory lock
	// although nothing else differs that kumi can read (without the
	// privilege to read the system identifier, this is how another server
	// shows; or a proxy routes the two connections apart).
	MismatchLock SessionMismatch = "lock"
)

// SessionMismatchError is returned by [New], and by a pass that reopens
// the session, when KindSession's dedicated connection (Config.SessionURL)
// does not reach the pool's server and database, or either reaches a
// standby. Advisory locks are per server and per database: other workers
// would not see this worker's session lock, would take its buckets as
// those of a dead worker while it runs, and both would deliver. Nothing is
// written; the session is closed. The fields hold what each side reported
// (database names, system identifiers, recovery states), never a URL or a
// password.
type SessionMismatchError struct {
	Mismatch SessionMismatch // what differs
	Session  string          // what the session connection reached
	Pool     string          // what the pool reached
}

// Error names the mismatch, both sides and the fix.
func (e *SessionMismatchError) Error() string {
	return fmt.Sprintf("leasestore: KindSession's connection (Config.SessionURL) and the pool do not reach "+
		"the same primary database (%s mismatch: the session reaches %s, the pool %s); advisory locks are "+
		"per server and per database, so the other workers would not see this worker's session lock and would "+
		"take its buckets while it runs: point SessionURL at the pool's primary server and database, or leave it empty",
		e.Mismatch, e.Session, e.Pool)
}

// ConfigError reports true: the error is a supervision.ConfigMarker, so
// supervision classifies it as invalid configuration (Config.SessionURL, or
// the database it names, must change).
func (e *SessionMismatchError) ConfigError() bool { return true }

// SessionPoolerError is returned by [New], and by a pass that opens or
// checks the session ([Store.EnsureHeld] then fails with [ErrNotHeld],
// saying so), when KindSession's dedicated connection behaves as one
// through a transaction pooler (PgBouncer pool_mode=transaction,
// Supavisor, a pooled endpoint), whatever its URL looks like: the server
// connection that took the session lock served another client's
// transaction, or the session's own statements ran on two server
// connections. The lock would then stay with whichever server connection
// took it — held after this worker dies, or lost while it runs — and other
// workers' verdicts on it would be wrong. Nothing is written; the session
// is closed. Evidence names what was seen (backend pids), never a URL.
type SessionPoolerError struct {
	Evidence string
}

// Error says what was seen and the fix.
func (e *SessionPoolerError) Error() string {
	return "leasestore: KindSession's connection (Config.SessionURL, or the pool's when unset) goes through a " +
		"transaction pooler (" + e.Evidence + "), which hands its server connection, and the session lock on it, " +
		"to other clients between statements: give KindSession a direct connection (or PgBouncer in session mode), " +
		"or use KindRow"
}

// ConfigError reports true: the error is a supervision.ConfigMarker, so
// supervision classifies it as invalid configuration (Config.SessionURL, or
// the lease kind, must change).
func (e *SessionPoolerError) ConfigError() bool { return true }
