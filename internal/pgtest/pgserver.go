package pgtest

import (
	"context"

	"github.com/kumi-run/kumi/internal/pgserver"
)

// Server is a throwaway PostgreSQL server: [pgserver.Server].
type Server = pgserver.Server

// Options tune a throwaway server: [pgserver.Options].
type Options = pgserver.Options

// ErrNoServerBinaries is [pgserver.ErrNoServerBinaries].
var ErrNoServerBinaries = pgserver.ErrNoServerBinaries

// Start starts a throwaway server of a test's own (a database-restart
// test, a second cluster): [pgserver.Start].
func Start(ctx context.Context, opts Options) (*Server, error) { return pgserver.Start(ctx, opts) }

// FindBinaries returns the directory holding initdb and postgres:
// [pgserver.FindBinaries].
func FindBinaries() (string, error) { return pgserver.FindBinaries() }

// FreePort asks the kernel for a free loopback TCP port: [pgserver.FreePort].
func FreePort() (int, error) { return pgserver.FreePort() }

// Replica is a hot standby of a throwaway server: [pgserver.Replica].
type Replica = pgserver.Replica

// Lag is a standby's replay lag: [pgserver.Lag].
type Lag = pgserver.Lag

// ErrReplayPaused is [pgserver.ErrReplayPaused].
var ErrReplayPaused = pgserver.ErrReplayPaused

// Bouncer is a PgBouncer in front of a throwaway server: [pgserver.Bouncer].
type Bouncer = pgserver.Bouncer

// PoolMode is a PgBouncer pool_mode: [pgserver.PoolMode].
type PoolMode = pgserver.PoolMode

// The pool modes a [Bouncer] runs in.
const (
	PoolSession     = pgserver.PoolSession
	PoolTransaction = pgserver.PoolTransaction
)

// BouncerExecMode is the pgx query exec mode kumi needs behind PgBouncer
// before 1.21: [pgserver.BouncerExecMode].
const BouncerExecMode = pgserver.BouncerExecMode

// ErrNoBouncer is [pgserver.ErrNoBouncer].
var ErrNoBouncer = pgserver.ErrNoBouncer

// AutoFailover is a pg_auto_failover formation (a monitor and two nodes):
// [pgserver.AutoFailover].
type AutoFailover = pgserver.AutoFailover

// StartAutoFailover starts one: [pgserver.StartAutoFailover].
func StartAutoFailover(ctx context.Context) (*AutoFailover, error) {
	return pgserver.StartAutoFailover(ctx)
}
