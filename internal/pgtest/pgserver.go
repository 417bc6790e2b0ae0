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
