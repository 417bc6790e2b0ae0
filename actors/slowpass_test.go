package actors

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// slowPasses is a pgx tracer that makes every lease pass take at least
// delay: it holds the pass's first round trip back (the batch that opens
// with the pass's lock bound) for that long. It plays the CPU starvation
// of a loaded machine, where a pass's few round trips each wait for a
// goroutine to be scheduled, without hoping for the load. Set on a
// worker's store pool, it reaches the lease store through the group's
// lease pool, which copies the store pool's configuration.
type slowPasses struct {
	delay  atomic.Int64 // nanoseconds; 0: passes run as they come
	passes atomic.Int64 // passes held back
}

func (s *slowPasses) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if d := time.Duration(s.delay.Load()); d > 0 && opensPass(data.Batch.QueuedQueries) {
		s.passes.Add(1)
		time.Sleep(d) // the injected slowness itself
	}
	return ctx
}

// opensPass reports whether a batch is a pass's first: it sets the pass's
// lock bound (after the BEGIN the batch may carry) among other statements.
func opensPass(q []*pgx.QueuedQuery) bool {
	if len(q) < 3 {
		return false
	}
	for _, qq := range q[:2] {
		if strings.Contains(qq.SQL, "idle_in_transaction_session_timeout") {
			return true
		}
	}
	return false
}

func (*slowPasses) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*slowPasses) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (*slowPasses) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*slowPasses) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// startSlowWorker is startWorker on a pool whose lease passes slow holds
// back.
func startSlowWorker(t *testing.T, schema, name string, opts GroupOptions, slow *slowPasses) *testWorker {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns, cfg.ConnConfig.Tracer = 12, slow
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	w := startWorkerOn(t, pool, schema, name, opts)
	// Registered after the worker's stop, so run before it: the final
	// release is a pass's kin, let it through.
	t.Cleanup(func() { slow.delay.Store(0) })
	return w
}

// A lease pass is abandoned after one heartbeat. Under the race detector,
// with every package's tests sharing two cores, a pass — a few round
// trips, each waiting for its goroutine to be scheduled — took longer than
// the 150 ms heartbeat these tests' leases had: every pass was abandoned,
// the worker claimed nothing, and
// TestSeveralInFlightKeepPerStreamOrderThroughRetries handled none of its
// 600 events in 60 s. fastLease's heartbeat leaves such passes room: here
// every pass is held back for twice the old heartbeat, and the worker
// still claims its buckets and delivers.
func TestTheTestsLeaseTimingsTolerateSlowPasses(t *testing.T) {
	t.Parallel()
	w, rec, slow := slowDrain(t, "slowpass", func(leasestore.LeaseOptions) time.Duration { return 300 * time.Millisecond })
	requireAllHandledThroughSlowPasses(t, w, rec, slow)
}

// The same stall in production: while every pass outlasts its bound (a
// database or host too slow for the timings chosen: longer than TTL −
// Margin, the longest bound a pass gets after abandoned ones), the worker
// claims and renews nothing and delivers nothing — loudly: each abandoned
// pass is logged at Warn, and Runtime.Healthy reports the group once TTL −
// Margin has passed without a pass. Nothing else has to wake it: the first
// pass that fits claims the buckets, and the backlog is delivered.
func TestAWorkerWhosePassesOutlastItsHeartbeatDeliversNothingUntilOneFits(t *testing.T) {
	t.Parallel()
	w, rec, slow := slowDrain(t, "outlast", func(l leasestore.LeaseOptions) time.Duration { return l.TTL })

	var health *HealthError
	pgtest.Eventually(t, waitLong, func() bool { return errors.As(w.rt.Healthy(context.Background()), &health) },
		"the runtime reports the group unhealthy: %v", observed(func() error { return w.rt.Healthy(context.Background()) }))
	pgtest.Eventually(t, waitLong, func() bool {
		w.group.g.mu.Lock()
		defer w.group.g.mu.Unlock()
		return w.group.g.passErr != nil && strings.Contains(w.group.g.passErr.Error(), "abandoned after 3s")
	}, "a pass abandoned at the longest bound, TTL − Margin (last pass error: %v)", observed(func() error {
		w.group.g.mu.Lock()
		defer w.group.g.mu.Unlock()
		return w.group.g.passErr
	}))
	require.Zero(t, rec.distinct(), "nothing delivered while every pass is abandoned")
	require.Empty(t, w.owned(), "nothing claimed")
	require.Positive(t, slow.passes.Load())

	slow.delay.Store(0)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 60 }, "all handled once a pass fits (got %d)%s",
		observed(rec.distinct), observed(w.diagnose))
	pgtest.Eventually(t, waitLong, func() bool { return w.rt.Healthy(context.Background()) == nil }, "healthy again: %v",
		observed(func() error { return w.rt.Healthy(context.Background()) }))
}

// Passes that take longer than the heartbeat, but not than TTL − Margin,
// land: an abandoned pass doubles the next one's bound. With a bound of
// one heartbeat every such pass was abandoned and the worker claimed
// nothing.
func TestPassesSlowerThanTheHeartbeatStillLand(t *testing.T) {
	t.Parallel()
	w, rec, slow := slowDrain(t, "slower", func(l leasestore.LeaseOptions) time.Duration { return l.Heartbeat + l.Heartbeat/2 })
	requireAllHandledThroughSlowPasses(t, w, rec, slow)
}

// slowDrain starts one worker on a subscription of 2 buckets with 60
// events seeded, whose lease passes are held back for delay(its lease
// options) each.
func slowDrain(t *testing.T, sub string, delay func(leasestore.LeaseOptions) time.Duration) (*testWorker, *recorder, *slowPasses) {
	t.Helper()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 6, 60)
	rec := newRecorder()
	slow := &slowPasses{}
	o := groupOpts(sub, 2, rec, "w")
	slow.delay.Store(int64(delay(o.Lease)))
	return startSlowWorker(t, schema, "w", o, slow), rec, slow
}

// requireAllHandledThroughSlowPasses waits until the 60 events are
// handled, each once, with the passes held back.
func requireAllHandledThroughSlowPasses(t *testing.T, w *testWorker, rec *recorder, slow *slowPasses) {
	t.Helper()
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 60 }, "all handled (got %d, %d passes held back)%s",
		observed(rec.distinct), observed(slow.passes.Load), observed(w.diagnose))
	require.Positive(t, slow.passes.Load(), "the passes were held back")
	require.Zero(t, rec.duplicates())
}
