package actors

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// sharedPasses is a pgx tracer that records the most lease passes one
// round trip has carried: a batch that opens a pass (see opensLeasePass)
// carries as many passes as it has renewals — not its COMMITs: the joins
// that share a round trip (leasestore.PassBatcher) open as a pass does,
// without a renewal.
type sharedPasses struct{ most atomic.Int64 }

func (s *sharedPasses) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if opensLeasePass(data.Batch.QueuedQueries) {
		n := int64(0)
		for _, q := range data.Batch.QueuedQueries {
			if strings.Contains(q.SQL, "WITH mine AS MATERIALIZED") { // the renewal (leasestore's renew)
				n++
			}
		}
		for {
			m := s.most.Load()
			if n <= m || s.most.CompareAndSwap(m, n) {
				break
			}
		}
	}
	return ctx
}

func (*sharedPasses) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*sharedPasses) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (*sharedPasses) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*sharedPasses) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The steady lease passes of a runtime's groups share one round trip: the
// groups' heartbeats fall at the runtime's beats, and its PassBatcher
// sends the passes that come together in one batch, each pass's commit in
// it. Before, every group's pass was a batch and a COMMIT of its own.
func TestTheGroupsOfARuntimeRenewInOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	trace := &sharedPasses{}
	cfg.MaxConns, cfg.ConnConfig.Tracer = 8, trace
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	rt, err := startedRuntime(ctx, quietSystem(), store, RuntimeOptions{Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_ = rt.Stop(sctx)
	})
	const k = 6
	var opts []GroupOptions
	for i := range k {
		o := groupOpts(fmt.Sprintf("batched-%d", i), 2, nil, "w")
		o.Worker = "w"
		opts = append(opts, o)
	}
	groups, _, err := startGroups(ctx, rt, opts)
	require.NoError(t, err)
	require.Len(t, groups, k)
	pgtest.Eventually(t, 30*time.Second, func() bool { return trace.most.Load() >= k },
		fmt.Sprintf("one round trip carries the %d groups' passes (most seen: %d)", k, trace.most.Load()))
	for _, gr := range groups {
		require.Len(t, gr.g.ownedBuckets(), 2)
	}
}

// startGroups starts the groups together and returns them in the order
// of their options; the first that fails is named by its index, and the
// groups are not returned.
func TestStartGroupsReturnsTheGroupsInOrderAndNamesTheOneThatFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := newTestStore(t)
	rt, err := startedRuntime(ctx, quietSystem(), store, RuntimeOptions{Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_ = rt.Stop(sctx)
	})
	var opts []GroupOptions
	for i := range 2 * groupStarts {
		opts = append(opts, groupOpts(fmt.Sprintf("start-%d", i), 1, nil, "w"))
	}
	groups, _, err := startGroups(ctx, rt, opts)
	require.NoError(t, err)
	require.Len(t, groups, len(opts))
	for i, gr := range groups {
		require.Equal(t, opts[i].Subscription, gr.g.opts.Subscription)
	}

	bad := make([]GroupOptions, 0, len(opts))
	for i := range len(opts) {
		bad = append(bad, groupOpts(fmt.Sprintf("bad-%d", i), 1, nil, "w"))
	}
	// A group that cannot start: its session connection's URL does not
	// parse.
	bad[5].Lease.Kind, bad[5].Lease.SessionURL = leasestore.KindSession, "postgres://%zz"
	groups, failed, err := startGroups(ctx, rt, bad)
	require.Error(t, err)
	require.Equal(t, 5, failed)
	require.Nil(t, groups)
}
