package actors

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
)

// namedPool is a pool of maxConns on the test database whose connections,
// and those made with its settings, carry application_name app.
func namedPool(t *testing.T, app string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// connectionsOf counts the database's connections named app.
func connectionsOf(t *testing.T, app string) int {
	t.Helper()
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
	return n
}

// Every group of a process shares the runtime's lease pool: six groups
// hold their buckets with the process's connections bounded by its pools'
// sizes (the store's 4, the lease pool's 2, the sequencer's and the
// notifier's one each), not by the number of groups (each had a pool of
// its own: 6 × 2 more).
func TestGroupsShareTheProcessLeasePool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	app := "kumi-lease-pool-" + schema
	store, err := eventsource.New(namedPool(t, app, 4), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	rt, err := startedRuntime(ctx, quietSystem(), store, RuntimeOptions{Logger: testLogger(), LeasePoolConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, rt.Stop(sctx))
	})
	var groups []*Group
	for i := range 6 {
		g, err := rt.StartGroup(ctx, GroupOptions{Subscription: fmt.Sprintf("shared-%d", i), Category: "shared", Buckets: 4,
			Lease: fastLease(), Handler: Func(func(context.Context, *Delivery) error { return nil })})
		require.NoError(t, err)
		groups = append(groups, g)
	}
	passes := func() bool {
		for _, g := range groups {
			if len(g.g.ownedBuckets()) != 4 {
				return false
			}
		}
		return rt.Healthy(ctx) == nil
	}
	pgtest.Eventually(t, time.Minute, passes, "every group holds its buckets")
	// A few more passes of every group, on the shared connections.
	mark := make([]time.Time, len(groups))
	for i, g := range groups {
		mark[i] = g.g.renewed()
	}
	pgtest.Eventually(t, time.Minute, func() bool {
		for i, g := range groups {
			if !g.g.renewed().After(mark[i]) {
				return false
			}
		}
		return true
	}, "every group passed again")
	require.Equal(t, int32(2), rt.leasePool.Stat().MaxConns())
	require.LessOrEqual(t, connectionsOf(t, app), 4+2+1+1)
}

// LeasePoolConns out of its bounds is refused at construction, naming it.
func TestRuntimeRefusesALeasePoolOutOfBounds(t *testing.T) {
	t.Parallel()
	store, _ := newTestStore(t)
	for _, v := range []int{-1, MinLeasePoolConns - 1, MaxLeasePoolConns + 1} {
		_, err := New(quietSystem(), store, RuntimeOptions{LeasePoolConns: v})
		var oe *kumierr.ConfigError
		require.True(t, errors.As(err, &oe), "LeasePoolConns %d: %v", v, err)
		require.Equal(t, "actors.RuntimeOptions.LeasePoolConns", oe.Field)
	}
	rt, err := New(quietSystem(), store, RuntimeOptions{})
	require.NoError(t, err)
	require.Equal(t, LeasePoolConnsDefault, rt.opts.LeasePoolConns)
}

// renewed returns when the last successful lease pass started.
func (g *group) renewed() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.renewedAt
}

// The lag of every group of a process is measured in one statement,
// however many groups and buckets it holds: each held bucket's checkpoint
// and backlog, as the lag gauges and Status report them (there were a
// statement per bucket and a checkpoint read per group).
func TestLagIsMeasuredInOneStatementPerProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "lagged", 20, 60)
	seed(t, store, "other", 5, 10)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	stmts := newStatementCounter()
	cfg.MaxConns, cfg.ConnConfig.Tracer = 8, stmts
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	release := make(chan struct{})
	stuck := Func(func(ctx context.Context, _ *Delivery) error {
		select { // nothing is handled: every bucket keeps its backlog
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	w := startWorkerOn(t, pool, schema, "w", GroupOptions{Subscription: "lagged", Category: "lagged", Buckets: 8,
		Lease: fastLease(), HandlerTimeout: 10 * time.Minute, Handler: stuck})
	other, err := w.rt.StartGroup(ctx, GroupOptions{Subscription: "other", Category: "other", Buckets: 4, Worker: "w",
		Lease: fastLease(), HandlerTimeout: 10 * time.Minute, Handler: stuck})
	require.NoError(t, err)
	t.Cleanup(func() { close(release) }) // before the worker's graceful stop, registered earlier: cleanups run last first
	groups := []struct {
		g              *group
		buckets, added int
	}{{w.group.g, 8, 60}, {other.g, 4, 10}}
	want := map[*group]map[int]int64{}
	pgtest.Eventually(t, waitLong, func() bool {
		for _, c := range groups {
			evs, err := store.ReadCategory(ctx, c.g.opts.Category, 0, 0)
			require.NoError(t, err)
			want[c.g] = map[int]int64{}
			for b := range c.buckets {
				want[c.g][b] = 0
			}
			for _, e := range evs {
				want[c.g][e.Bucket(c.buckets)]++
			}
			if len(c.g.ownedBuckets()) != c.buckets || len(evs) != c.added {
				return false
			}
		}
		return true
	}, "the events sequenced and every bucket held")
	require.NoError(t, w.rt.measureAllLags(markStatements(ctx), w.group.g, time.Now().Add(time.Hour)))
	require.Equal(t, int64(1), stmts.marked.Load(), "statements of one measurement of 2 groups' 12 buckets")
	w.rt.lagMu.Lock() // no measurement under way: both groups' last ones are one
	var at []time.Time
	for _, c := range groups {
		g := c.g
		g.mu.Lock()
		got := map[int]int64{}
		for b, l := range g.lags {
			require.Zero(t, l.checkpoint, "%s bucket %d: nothing was handled", g.opts.Subscription, b)
			got[b] = l.events
		}
		at = append(at, g.lagAt)
		g.mu.Unlock()
		require.Equal(t, want[g], got, g.opts.Subscription)
	}
	w.rt.lagMu.Unlock()
	require.Equal(t, at[0], at[1], "both groups measured together")

	st, err := w.group.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Owned, 8)
	for _, b := range st.Owned {
		require.Equal(t, want[w.group.g][b.Slot], b.Lag, "Status: slot %d", b.Slot)
	}
}

// Every session-kind group of a process holds its session lock on the
// runtime's one session connection (leasestore.Sessions): six groups cost
// one connection beside the pools, not six, and hold six locks on it, one
// per (subscription, worker). When that connection is terminated, every
// group's locks go at once: each group's next pass reopens it (one
// connection again) and takes its lock back, and every group holds its
// buckets again.
func TestSessionKindGroupsShareOneSessionConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	app := "kumi-sessions-" + schema
	store, err := eventsource.New(namedPool(t, app, 4), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	rt, err := startedRuntime(ctx, quietSystem(), store, RuntimeOptions{Logger: testLogger(), LeasePoolConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, rt.Stop(sctx))
	})
	lease := fastLease()
	lease.Kind = leasestore.KindSession
	var groups []*Group
	for i := range 6 {
		g, err := rt.StartGroup(ctx, GroupOptions{Subscription: fmt.Sprintf("sessions-%d", i), Category: "sessions",
			Buckets: 4, Worker: "w", Lease: lease, Handler: Func(func(context.Context, *Delivery) error { return nil })})
		require.NoError(t, err)
		groups = append(groups, g)
	}
	sessions := rt.sessions[""]
	require.Len(t, rt.sessions, 1)
	locksOn := func(pid int) int {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
			"SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND granted AND objsubid = 1", pid).Scan(&n))
		return n
	}
	holding := func(pid *int) func() bool {
		return func() bool {
			for _, g := range groups {
				if len(g.g.ownedBuckets()) != 4 {
					return false
				}
			}
			*pid = sessions.BackendPID()
			return *pid != 0 && locksOn(*pid) == 6 && rt.Healthy(ctx) == nil
		}
	}
	var pid int
	pgtest.Eventually(t, time.Minute, holding(&pid), "every group holds its buckets, its lock on the one session")
	require.LessOrEqual(t, connectionsOf(t, app), 4+2+1+1+1, "the pools, the sequencer, the notifier and one session")

	var killed bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&killed))
	require.True(t, killed)
	var again int
	pgtest.Eventually(t, time.Minute, func() bool { return holding(&again)() && again != pid },
		"every group holds its buckets again, its lock on a new session")
	require.LessOrEqual(t, connectionsOf(t, app), 4+2+1+1+1)
}
