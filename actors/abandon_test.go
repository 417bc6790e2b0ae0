package actors

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// passConns is a pgx tracer that, once armed, records the server
// process of every connection a lease pass opens on (see opensPass).
type passConns struct {
	mu    sync.Mutex
	armed bool
	pids  map[uint32]bool
	n     int
}

func (p *passConns) arm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.pids, p.n = true, map[uint32]bool{}, 0
}

// seen returns the passes opened since arm and their distinct connections.
func (p *passConns) seen() (passes, conns int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, len(p.pids)
}

func (p *passConns) TraceBatchStart(ctx context.Context, c *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if opensPass(data.Batch.QueuedQueries) {
		p.mu.Lock()
		if p.armed {
			p.n++
			p.pids[c.PgConn().PID()] = true
		}
		p.mu.Unlock()
	}
	return ctx
}

func (*passConns) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*passConns) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (*passConns) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*passConns) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A lease pass abandoned at its bound, waiting on the server (here for
// its worker's row, which another session holds locked), has its
// statement cancelled and its transaction rolled back on its connection,
// which later passes reuse: four abandoned passes run on the lease pool's
// two connections. Before, pgx closed the connection to interrupt the
// statement, so every abandoned pass cost a reconnect and the statements'
// preparation (four passes, four connections) — on a loaded host enough to
// make the next pass late too, a worker thawed from an overload never
// rejoining. Once the row is free the group renews again.
func TestAnAbandonedPassKeepsItsConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	tracer := &passConns{}
	cfg.MaxConns, cfg.ConnConfig.Tracer = 4, tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	rt, err := startedRuntime(ctx, quietSystem(), store, RuntimeOptions{Logger: testLogger(), LeasePoolConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, rt.Stop(sctx))
	})
	g, err := rt.StartGroup(ctx, GroupOptions{Subscription: "abandon", Category: "abandon", Buckets: 2, Worker: "w",
		Lease: fastLease(), Handler: Func(func(context.Context, *Delivery) error { return nil })})
	require.NoError(t, err)
	pgtest.Eventually(t, time.Minute, func() bool { return len(g.g.ownedBuckets()) == 2 }, "the group holds its buckets")

	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema}.Sanitize()+".lease_workers WHERE subscription = 'abandon' AND worker = 'w' FOR UPDATE")
	require.NoError(t, err)
	tracer.arm()
	pgtest.Eventually(t, 2*time.Minute, func() bool { passes, _ := tracer.seen(); return passes >= 4 },
		"four passes opened while the worker's row is locked")
	passes, conns := tracer.seen()
	require.NoError(t, tx.Rollback(ctx))
	require.LessOrEqual(t, conns, 2, "%d abandoned passes ran on %d connections: each closed its own", passes, conns)

	mark := time.Now()
	pgtest.Eventually(t, time.Minute, func() bool {
		return g.g.renewed().After(mark) && len(g.g.ownedBuckets()) == 2
	}, "the group renews and holds its buckets once the row is free")
}
