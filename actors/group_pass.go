package actors

// The lease passes: their pool, their timing, what each one records.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/leasestore"
)

// passLinger is how long a group's lease pass waits for the passes of
// the runtime's other groups to join its round trip
// (leasestore.PassBatcher). The groups' heartbeats are aligned
// (Runtime.beat), so their passes come within a few milliseconds of one
// another.
const passLinger = 20 * time.Millisecond

// nextBeat is how long from now until the next heartbeat of a group whose
// heartbeats fall at origin + n × interval.
func nextBeat(origin time.Time, interval time.Duration) time.Duration {
	return interval - time.Since(origin)%interval
}

// leaseCancelDeadline is how long a lease pool's connection waits for the
// server to answer a cancelled statement before it is closed.
const leaseCancelDeadline = time.Second

// newLeasePool makes the process's pool for its groups' lease stores, with
// the store pool's settings and conns connections (RuntimeOptions.
// LeasePoolConns). Renewal must never queue behind the readers' and
// handlers' work for a connection of the store's pool: a busy pool would
// delay the passes until the leases became unsure and other workers took
// the buckets over. The groups' passes share it: each holds a connection
// for a round trip or two per heartbeat.
func newLeasePool(ctx context.Context, store *pgxpool.Pool, conns int) (*pgxpool.Pool, error) {
	cfg := store.Config().Copy()
	n := int32(min(conns, MaxLeasePoolConns)) // validated by New
	cfg.MaxConns = n
	cfg.MinConns = min(cfg.MinConns, n)
	cfg.MinIdleConns = min(cfg.MinIdleConns, n)
	// A statement whose context ends (a pass abandoned at its bound) is
	// cancelled on the server, and the connection kept: pgx's default
	// closes it, and the next pass pays a reconnect and the statements'
	// preparation, which on a loaded host made the next pass too slow in
	// turn (TestAnAbandonedPassKeepsItsConnection). A server that does not
	// answer the cancel within leaseCancelDeadline gets the connection
	// closed, as before.
	cfg.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: leaseCancelDeadline}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("kumi: lease pool: %w", err)
	}
	return pool, nil
}

func (g *group) setPass(res leasestore.PassResult, start time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.liveWorkers = res.Live
	g.renewedAt, g.passErr = start, nil
}

// passFailed records the error of a failed lease pass for Healthy.
func (g *group) passFailed(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.passErr = err
}
