package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestNoSkipThroughPgBouncer: the no-skip scenario with every connection
// of the worker processes and of the appenders going through a real
// PgBouncer 1.18 in transaction mode, configured as docs/operations.md
// says (default_query_exec_mode=cache_describe in the URL, row leases, no
// lease LISTEN, the consumer-group index built first over a direct
// connection, as `kumi migrate --group-size 8` does: its session advisory
// lock does not hold through a transaction pooler, and workers building it
// at once there deadlocked). The runtime's notifier LISTENs through the
// pooler and hears nothing; deliveries ride on its safety poll.
func TestNoSkipThroughPgBouncer(t *testing.T) {
	srv := pgtest.LocalServer(t)
	b := pgtest.NewBouncer(t, srv, pgtest.PoolTransaction)
	e := newEnv(t, srv.URL, clusterConfig{Buckets: 8, Kind: leasestore.KindRow, WorkerURL: b.URL, NoListen: true})
	buildGroupIndex(t, srv.URL, e.cfg.Schema, e.cfg.Buckets)
	e.startWorkers(2, startOpts{})
	// PgBouncer 1.18 (Debian 12's) exits now and then on an aborted cancel
	// request (see pgserver.Bouncer); the test's bouncer is started again
	// as a service manager would. The scenario crashes it once on purpose,
	// so that every run goes through a pooler's restart.
	runNoSkip(t, e, "no-skip-through-pgbouncer", b.URL, b)
	if b.Crashes() == 0 {
		t.Errorf("the bouncer never crashed: the scenario tested less than it claims")
	}
}

// buildGroupIndex builds schema's consumer-group index for n buckets over
// a direct connection to url, as an operator runs `kumi migrate
// --group-size n` before workers that reach the database through a
// transaction pooler start.
func buildGroupIndex(t *testing.T, url, schema string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("group index: %v", err)
	}
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	if err == nil {
		err = store.EnsureConsumerGroupIndex(ctx, n)
	}
	if err != nil {
		t.Fatalf("group index: %v", err)
	}
}
