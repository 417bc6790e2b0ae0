package actors

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// BenchmarkReadPoolPrimaryCPU: the primary's CPU per delivered event when
// a worker drains pre-appended events with its reads on the primary, and
// in the same run the same events (another subscription) with its reads
// on a hot standby (RuntimeOptions.ReadPool): four drains, in the order
// primary, standby, standby, primary, each after a CHECKPOINT, so that
// neither side pays more of the seed's background writes. The CPU is the
// server processes' own, from /proc (pgserver.Server.CPUSeconds: the
// postmaster, its running children and its reaped ones), so it counts
// every backend, the WAL writer and autovacuum, and nothing of this
// process; the standby's is reported beside it. Run it alone: other
// tests' sessions on the same server count too.
func BenchmarkReadPoolPrimaryCPU(b *testing.B) {
	ctx := context.Background()
	n := benchEvents()
	srv := pgtest.LocalServer(b)
	schema := pgtest.NewSchema(b)
	store, err := eventsource.New(pgtest.PoolOn(b, srv.URL, 8), eventsource.Config{Schema: schema})
	require.NoError(b, err)
	require.NoError(b, Migrate(ctx, store))
	seedBench(b, store, n)
	require.NoError(b, store.EnsureConsumerGroupIndex(ctx, 16))
	r := pgtest.NewReplica(b, srv)
	require.NoError(b, r.WaitReplayed(ctx))
	_, err = pgtest.PoolOn(b, r.URL, 1).Exec(ctx, "SELECT count(*) FROM "+store.QuotedSchema()+".events") // warm the standby's cache as the seed warmed the primary's
	require.NoError(b, err)

	perEvent := func(s float64) float64 { return s * 1e6 / float64(n) }
	drain := func(name string, onReplica bool) (primaryCPU float64) {
		_, err := store.Pool().Exec(ctx, "CHECKPOINT")
		require.NoError(b, err)
		w := &testWorker{name: name, sys: quietSystem(), pool: pgtest.PoolOn(b, srv.URL, 24)}
		s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
		require.NoError(b, err)
		ro := RuntimeOptions{}
		if onReplica {
			ro.ReadPool = pgtest.PoolOn(b, r.URL, 24)
		}
		primary0, err := srv.CPUSeconds()
		require.NoError(b, err)
		standby0, err := r.CPUSeconds()
		require.NoError(b, err)
		start := time.Now()
		w.rt, err = startedRuntime(ctx, w.sys, s, ro)
		require.NoError(b, err)
		var handled atomic.Int64
		w.startGroup(b, GroupOptions{Subscription: name, Category: "bench", Buckets: 16,
			Handler: counting(&handled), Lease: benchLease(), MaxInFlight: 32, CheckpointEvery: 1000, BatchSize: benchPage()})
		pgtest.Eventually(b, 10*time.Minute, func() bool { return handled.Load() >= int64(n) }, "%s drains %d events", name, n)
		elapsed := time.Since(start)
		primary1, err := srv.CPUSeconds()
		require.NoError(b, err)
		standby1, err := r.CPUSeconds()
		require.NoError(b, err)
		var reads eventsource.ReadReplicaStats
		if rr := w.rt.ReadReplica(); rr != nil {
			reads = rr.Stats()
		}
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		require.NoError(b, w.rt.Stop(sctx))
		b.Logf("%s: %d events in %v; primary CPU %.2f s (%.2f µs/event), standby CPU %.2f s (%.2f µs/event); pages on the standby %d, on the primary %d",
			name, n, elapsed.Round(time.Millisecond), primary1-primary0, perEvent(primary1-primary0),
			standby1-standby0, perEvent(standby1-standby0), reads.StandbyReads, reads.PrimaryReads)
		return primary1 - primary0
	}
	var onPrimary, onStandby float64
	for i := range b.N {
		onPrimary += drain(fmt.Sprintf("primary-%d-a", i), false)
		onStandby += drain(fmt.Sprintf("standby-%d-a", i), true)
		onStandby += drain(fmt.Sprintf("standby-%d-b", i), true)
		onPrimary += drain(fmt.Sprintf("primary-%d-b", i), false)
	}
	b.ReportMetric(perEvent(onPrimary/float64(2*b.N)), "primary-µs/event-reads-on-primary")
	b.ReportMetric(perEvent(onStandby/float64(2*b.N)), "primary-µs/event-reads-on-standby")
}
