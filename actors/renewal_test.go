package actors

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

// holders returns each bucket's owner and epoch.
func holders(t *testing.T, schema, sub string) map[int]string {
	t.Helper()
	rows, err := pgtest.Pool(t).Query(context.Background(),
		"SELECT bucket, coalesce(owner, ''), epoch FROM "+pgx.Identifier{schema}.Sanitize()+".lease_buckets WHERE subscription = $1", sub)
	require.NoError(t, err)
	out := map[int]string{}
	for rows.Next() {
		var b int
		var owner string
		var epoch int64
		require.NoError(t, rows.Scan(&b, &owner, &epoch))
		out[b] = fmt.Sprintf("%s@%d", owner, epoch)
	}
	require.NoError(t, rows.Err())
	return out
}

// exhaust takes every connection of pool until the returned function is
// called: the worker's pool as busy as a database-writing handler under a
// backlog can make it.
func exhaust(t *testing.T, pool *pgxpool.Pool) (release func()) {
	t.Helper()
	var held []*pgxpool.Conn
	for range pool.Config().MaxConns {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		c, err := pool.Acquire(ctx)
		cancel()
		require.NoError(t, err)
		held = append(held, c)
	}
	return func() {
		for _, c := range held {
			c.Release()
		}
	}
}

// Renewal must not depend on the store's pool, nor wait for the lag
// measurement: with every connection of a worker's pool taken (by its own
// handlers, say) for longer than the TTL and the lag interval, the worker
// keeps renewing its leases and a rival worker takes none of them.
func TestLeasesAreRenewedWhileTheStorePoolIsBusy(t *testing.T) {
	t.Parallel()
	_, schema := newTestStore(t)
	rec := newRecorder()
	oa, ob := groupOpts("busy", 4, rec, "a"), groupOpts("busy", 4, rec, "b")
	// A slower profile than fastLease, so that only a stuck pass (not a
	// busy machine) lets a lease lapse.
	lease := leasestore.LeaseOptions{TTL: 6 * time.Second, Heartbeat: time.Second, Margin: 2 * time.Second}
	oa.Lease, ob.Lease = lease, lease
	oa.DatabaseTimeout = 20 * time.Second // longer than the TTL: a pass stuck on the pool holds renewal that long
	a := startWorker(t, schema, "a", oa)
	b := startWorker(t, schema, "b", ob)
	pgtest.Eventually(t, waitLong, func() bool { return fairSplit(4, a, b) }, "fair split: %v", owners(a, b))
	before := holders(t, schema, "busy")

	var holdStart time.Time
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "SELECT now()").Scan(&holdStart))
	release := exhaust(t, a.pool)
	// Renewed well after the hold began, on the database's clock: a lag
	// measurement came due within lagInterval, and a pass that waited for
	// it could have renewed until a TTL after that at most.
	mark := holdStart.Add(lagInterval + 2*lease.TTL)
	var after map[int]string
	renewed := false
	pgtest.WaitFor(waitLong, func() bool {
		if after = holders(t, schema, "busy"); fmt.Sprint(after) != fmt.Sprint(before) {
			return true // lost: no need to wait longer
		}
		var last time.Time
		err := pgtest.Pool(t).QueryRow(context.Background(),
			"SELECT coalesce(min(expires_at), 'epoch') FROM "+pgx.Identifier{schema}.Sanitize()+
				".lease_buckets WHERE subscription = 'busy' AND owner = 'a'").Scan(&last)
		renewed = err == nil && last.After(mark)
		return renewed
	})
	release()
	require.Equal(t, before, after, "no lease changed hands while a's pool was busy")
	require.True(t, renewed, "a kept renewing its leases while its pool was busy")
}

// A successful pass after the leases went more than two heartbeats without
// renewal (here the renewals wait for row locks another session holds, and
// give up) is counted as late.
func TestALatePassIsCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })
	tel := observability.New(observability.Options{MeterProvider: mp, Logger: testLoggerOrDiscard()})
	o := groupOpts("late", 2, newRecorder(), "w")
	w := startTracedWorker(t, schema, "w", o, tel)
	pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 2 }, "w owns both buckets")

	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema}.Sanitize()+".lease_buckets WHERE subscription = 'late' FOR UPDATE")
	require.NoError(t, err)
	// A pass gives up at its deadline; wait until three have failed, so the
	// leases have gone more than two heartbeats without renewal.
	var rm metricdata.ResourceMetrics
	pgtest.Eventually(t, waitLong, func() bool {
		require.NoError(t, reader.Collect(ctx, &rm))
		return sums(rm, obsname.MetricLeaseOperations, obsname.AttrOutcome)["error"] >= 3
	}, "passes fail on the locked lease rows")
	require.NoError(t, tx.Commit(ctx))
	pgtest.Eventually(t, waitLong, func() bool {
		require.NoError(t, reader.Collect(ctx, &rm))
		return sums(rm, obsname.MetricLeasePassesLate, "")[""] >= 1
	}, "the late pass is counted")
}

// Health follows the lease passes: a worker whose passes cannot reach the
// database (here they wait for locked lease rows and give up) turns
// unhealthy on /healthz once its leases are unsure, and healthy again once
// a pass succeeds. (A group ended by a failure is unhealthy too: see
// TestAConfigurationErrorInAReaderEndsTheGroupVisibly.)
func TestHealthFollowsTheLeasePasses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	o := groupOpts("health", 2, newRecorder(), "w")
	w := startWorker(t, schema, "w", o)
	srv := httptest.NewServer(observability.Handler(observability.HandlerOptions{Healthy: w.rt.Healthy}))
	t.Cleanup(srv.Close)
	healthz := func() int {
		resp, err := srv.Client().Get(srv.URL + "/healthz")
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 2 }, "w owns both buckets")
	require.Equal(t, http.StatusOK, healthz())

	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema}.Sanitize()+".lease_buckets WHERE subscription = 'health' FOR UPDATE")
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return healthz() == http.StatusServiceUnavailable }, "unhealthy while no pass succeeds")
	var he *HealthError
	require.ErrorAs(t, w.rt.Healthy(ctx), &he)
	require.Equal(t, "health", he.Subscription)
	require.Error(t, he.Err, "the last pass's error is reported")
	require.NoError(t, tx.Commit(ctx))
	pgtest.Eventually(t, waitLong, func() bool { return healthz() == http.StatusOK }, "healthy again once a pass succeeds")

	w.stop(t)
	require.Error(t, w.rt.Healthy(ctx), "a stopped runtime is not healthy")
}
