package leasestore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// countingTracer counts the statements a pool sends and the round trips
// they take (a pipelined batch is one round trip).
type countingTracer struct{ stmts, trips atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.stmts.Add(1)
	c.trips.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.trips.Add(1)
	return ctx
}
func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.stmts.Add(1)
}
func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func tracedPool(b testing.TB, conns int32) (*pgxpool.Pool, *countingTracer) {
	cfg, err := pgxpool.ParseConfig(pgtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	tr := &countingTracer{}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool, tr
}

func benchStores(b *testing.B, pool *pgxpool.Pool, kind Kind, workers, n int) []*Store {
	schema := pgtest.NewSchema(b)
	if err := Migrate(context.Background(), pool, schema); err != nil {
		b.Fatal(err)
	}
	stores := make([]*Store, workers)
	for i := range stores {
		s, err := startedStore(context.Background(), pool, Config{
			Schema: schema, Subscription: "bench", Worker: fmt.Sprintf("w%02d", i), Buckets: n,
			LeaseOptions: LeaseOptions{Kind: kind, NoListen: true},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Stop(context.Background()) })
		stores[i] = s
	}
	return stores
}

// One steady-state reconcile pass of one worker of a balanced pool: 32
// workers on N=1024, 32 buckets each, every lease renewed.
func BenchmarkPass(b *testing.B) {
	for _, kind := range []Kind{KindRow, KindSession} {
		b.Run(fmt.Sprintf("N=1024/workers=32/%s", kind), func(b *testing.B) {
			pool, tr := tracedPool(b, 40)
			stores := benchStores(b, pool, kind, 32, 1024)
			for range 2 {
				var wg sync.WaitGroup
				for _, s := range stores {
					wg.Add(1)
					go func() { defer wg.Done(); _, _ = s.Pass(context.Background()) }()
				}
				wg.Wait()
			}
			if got := len(stores[0].Held()); got != 32 {
				b.Fatalf("not balanced: worker 0 holds %d", got)
			}
			s := stores[0]
			stmts0, trips0 := tr.stmts.Load(), tr.trips.Load()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				res, err := s.Pass(context.Background())
				if err != nil || len(res.Owned) != 32 || len(res.Claimed) != 0 {
					b.Fatalf("pass: %v, owned %d", err, len(res.Owned))
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(tr.stmts.Load()-stmts0)/float64(b.N), "stmts/pass")
			b.ReportMetric(float64(tr.trips.Load()-trips0)/float64(b.N), "roundtrips/pass")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/pass")
		})
	}
}

// A whole pool's first pass at once: 32 workers (connections and statement
// caches warm) find N=1024 free buckets and run one pass each, concurrently.
func BenchmarkPoolRound(b *testing.B) {
	pool, tr := tracedPool(b, 40)
	stores := benchStores(b, pool, KindRow, 32, 1024)
	ctx := context.Background()
	reset := "UPDATE " + pgx.Identifier{stores[0].cfg.Schema, "lease_buckets"}.Sanitize() +
		" SET owner = NULL, expires_at = NULL, claim_worker = NULL, claimed_at = NULL"
	roundOnce := func() {
		var wg sync.WaitGroup
		for _, s := range stores {
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = s.Pass(ctx) }()
		}
		wg.Wait()
	}
	roundOnce() // warm up: connections, prepared statements
	var elapsed time.Duration
	var stmts int64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if _, err := pool.Exec(ctx, reset); err != nil {
			b.Fatal(err)
		}
		stmts0 := tr.stmts.Load()
		b.StartTimer()
		start := time.Now()
		roundOnce()
		elapsed += time.Since(start)
		b.StopTimer()
		stmts += tr.stmts.Load() - stmts0
		for _, s := range stores {
			if len(s.Held()) != 32 {
				b.Fatalf("the round left %s with %d", s.Worker(), len(s.Held()))
			}
		}
	}
	b.ReportMetric(float64(stmts)/float64(32*b.N), "stmts/pass")
	b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N)/1000, "ms/round")
}

// Claims per second under contention: 16 workers on N=1024; one op is a
// round in which every worker, at once, claims its fair share (64) and
// releases it again.
func BenchmarkClaimContention(b *testing.B) {
	pool, _ := tracedPool(b, 24)
	stores := benchStores(b, pool, KindRow, 16, 1024)
	ctx := context.Background()
	if err := stores[0].EnsureBuckets(ctx); err != nil {
		b.Fatal(err)
	}
	var claims, failed atomic.Int64
	cycle := func(s *Store) {
		res, err := s.Pass(ctx)
		if err != nil {
			failed.Add(1)
			return
		}
		claims.Add(int64(len(res.Claimed)))
		if err := s.Release(ctx, buckets(res.Owned)); err != nil {
			failed.Add(1)
		}
	}
	for _, s := range stores { // warm up
		cycle(s)
	}
	claims.Store(0)
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		for _, s := range stores {
			wg.Add(1)
			go func() { defer wg.Done(); cycle(s) }()
		}
		wg.Wait()
	}
	b.StopTimer()
	b.ReportMetric(float64(claims.Load())/b.Elapsed().Seconds(), "claims/s")
	b.ReportMetric(float64(claims.Load())/float64(b.N), "claims/op")
	b.ReportMetric(float64(failed.Load())/float64(b.N), "failed/op")
}

// passesPerOp is how many passes one op of BenchmarkPassCost runs: `make
// bench` runs each benchmark once (-benchtime 1x), and one pass is too short
// to time alone.
const passesPerOp = 200

// The cost of one worker's pass on N=64 with 1, 8 or 32 workers, each kind:
// steady (no resize), and during a resize (64 → 128, sealing: every pass
// balances both generations and re-checks the resize's transitions). The
// pool is balanced first; then one worker runs passes alone (the others
// stay live and hold their buckets). It reports statements and round trips
// per pass (a pipelined batch is one round trip, the session check of
// KindSession one more) and µs per pass.
func BenchmarkPassCost(b *testing.B) {
	const n, m = 64, 128
	for _, state := range []string{"steady", "resizing"} {
		for _, kind := range []Kind{KindRow, KindSession} {
			for _, workers := range []int{1, 8, 32} {
				b.Run(fmt.Sprintf("%s/%s/N=%d/workers=%d", state, kind, n, workers), func(b *testing.B) {
					ctx := context.Background()
					pool, tr := tracedPool(b, int32(workers+8))
					stores := benchStores(b, pool, kind, workers, n)
					benchSettle(b, stores, n)
					if state == "resizing" {
						benchResize(b, pool, stores[0].cfg.Schema, m)
						benchSettle(b, stores, n+m)
					}
					s := stores[0]
					owned := len(s.Held())
					stmts0, trips0 := tr.stmts.Load(), tr.trips.Load()
					b.ResetTimer()
					for range b.N {
						for range passesPerOp {
							res, err := s.Pass(ctx)
							if err != nil || len(res.Owned) != owned || len(res.Claimed)+len(res.Lost) != 0 {
								b.Fatalf("pass: %v; owned %d (was %d), claimed %d, lost %d",
									err, len(res.Owned), owned, len(res.Claimed), len(res.Lost))
							}
							if res.Resize.Resizing() != (state == "resizing") {
								b.Fatalf("pass saw the resize as %+v", res.Resize)
							}
						}
					}
					b.StopTimer()
					passes := float64(b.N * passesPerOp)
					b.ReportMetric(float64(tr.stmts.Load()-stmts0)/passes, "stmts/pass")
					b.ReportMetric(float64(tr.trips.Load()-trips0)/passes, "roundtrips/pass")
					b.ReportMetric(float64(b.Elapsed().Microseconds())/passes, "µs/pass")
				})
			}
		}
	}
}

// benchResize requests a resize to m buckets in schema (the event store
// beside the lease tables, the index for m built). Nobody proposes, so it
// stays sealing.
func benchResize(b *testing.B, pool *pgxpool.Pool, schema string, m int) {
	ctx := context.Background()
	es, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if err := es.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if err := es.EnsureConsumerGroupIndex(ctx, m); err != nil {
		b.Fatal(err)
	}
	if _, err := RequestResize(ctx, pool, schema, ResizeRequest{Subscription: "bench", Buckets: m}); err != nil {
		b.Fatal(err)
	}
}

// benchSettle runs rounds of every store's pass, then their hand-overs,
// until the slots are all held and nobody has anything to hand over or
// waits for a claim.
func benchSettle(b *testing.B, stores []*Store, slots int) {
	ctx := context.Background()
	for range 50 {
		results := make([]PassResult, len(stores))
		errs := make([]error, len(stores))
		var wg sync.WaitGroup
		for i, s := range stores {
			wg.Add(1)
			go func() { defer wg.Done(); results[i], errs[i] = s.Pass(ctx) }()
		}
		wg.Wait()
		held, busy := 0, false
		for i, s := range stores {
			if errs[i] != nil {
				b.Fatalf("pass of %s: %v", s.Worker(), errs[i])
			}
			for _, slot := range results[i].HandOff {
				if err := s.HandOver(ctx, slot); err != nil {
					b.Fatal(err)
				}
			}
			busy = busy || len(results[i].HandOff)+len(results[i].Pending)+len(results[i].Claimed) > 0
			held += len(results[i].Owned) - len(results[i].HandOff)
		}
		if held == slots && !busy {
			return
		}
	}
	b.Fatalf("the %d workers never settled on %d slots", len(stores), slots)
}
