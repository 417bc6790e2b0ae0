package integration

import (
	"testing"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestNoSkipThroughPgBouncer: the no-skip scenario with every connection
// of the worker processes and of the appenders going through a real
// PgBouncer 1.18 in transaction mode, configured as docs/operations.md
// says (default_query_exec_mode=exec in the URL, row leases, no lease
// LISTEN). The runtime's notifier LISTENs through the pooler and hears
// nothing; deliveries ride on its safety poll.
func TestNoSkipThroughPgBouncer(t *testing.T) {
	srv := pgtest.LocalServer(t)
	b := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction)
	e := newEnv(t, srv.URL, clusterConfig{Buckets: 8, Kind: leasestore.KindRow, WorkerURL: b.URL, NoListen: true})
	e.startWorkers(2, startOpts{})
	runNoSkip(t, e, "no-skip-through-pgbouncer", b.URL)
}
