package actors

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/supervision"
)

// blockingHandler blocks on every delivery until release is closed, ignoring
// its context: a handler stuck in a call that never returns. started is
// closed at the first delivery.
func blockingHandler(started, release chan struct{}) *actor.Props {
	first := make(chan struct{}, 1)
	first <- struct{}{}
	return actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*Delivery); ok {
			select {
			case <-first:
				close(started)
			default:
			}
			<-release
			ctx.Respond(Ack{})
		}
	})
}

// A handler blocked forever must not keep Runtime.Stop (and so the worker
// process) from returning: the stop honours its context and returns
// ctx.Err(), leaving the blocked handler behind.
func TestRuntimeStopHonoursItsContextWhileAHandlerIsBlocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 1)
	started, release := make(chan struct{}), make(chan struct{})
	// Released last (cleanups run in reverse order): the blocked handler
	// returns, and the goroutines it held end before goleak looks.
	t.Cleanup(func() { close(release) })

	sys := quietSystem()
	rt := newStopRuntime(t, sys, schema)
	o := GroupOptions{Subscription: "stuck", Category: "acct", Buckets: 1, Worker: "w",
		Handler: blockingHandler(started, release), Lease: fastLease()}
	g, err := rt.StartGroup(ctx, o)
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(waitLong):
		t.Fatal("the handler never got the event")
	}

	stopCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rt.Stop(stopCtx) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(waitLong):
		t.Fatal("Runtime.Stop did not return after its context ended")
	}
	select {
	case <-g.Done():
	default:
		t.Fatal("the group is not done after Runtime.Stop returned")
	}
	require.True(t, errors.Is(g.Err(), context.DeadlineExceeded), "the group reports why it ended: %v", g.Err())
}

// A reader that hits a configuration error (here a missing table, 42P01)
// cannot be cured by a restart: the group ends visibly. Done closes, the
// error is the group's, the leases are released at once and the worker
// leaves the pool, so that healthy workers take over without waiting
// for the TTL.
func TestAConfigurationErrorInAReaderEndsTheGroupVisibly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 2, 4)
	sys := quietSystem()
	rt := newStopRuntime(t, sys, schema)
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		_ = rt.Stop(c)
	})
	q := pgx.Identifier{schema}.Sanitize()
	_, err := pgtest.Pool(t).Exec(ctx, "ALTER TABLE "+q+".checkpoints RENAME TO checkpoints_gone")
	require.NoError(t, err)

	o := groupOpts("broken", 2, newRecorder(), "w")
	o.Worker = "w"
	// The TTL is five minutes: only a release explains a free bucket.
	o.Lease = leasestore.LeaseOptions{TTL: 5 * time.Minute, Heartbeat: time.Second, Margin: time.Minute}
	g, err := rt.StartGroup(ctx, o)
	require.NoError(t, err)
	select {
	case <-g.Done():
	case <-time.After(waitLong):
		t.Fatal("the group is not done after its reader hit a missing table")
	}
	var gf *GroupFailedError
	require.ErrorAs(t, g.Err(), &gf)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, g.Err(), &pgErr)
	require.Equal(t, "42P01", pgErr.Code)
	require.Equal(t, supervision.Config, gf.Class)
	require.Contains(t, gf.Fix, "kumi migrate")

	var held, workers int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		"SELECT count(*) FROM "+q+".lease_buckets WHERE subscription = 'broken' AND owner IS NOT NULL").Scan(&held))
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		"SELECT count(*) FROM "+q+".lease_workers WHERE subscription = 'broken'").Scan(&workers))
	require.Zero(t, held, "the failed group released its leases")
	require.Zero(t, workers, "the failed group left the pool")

	var he *HealthError
	require.ErrorAs(t, rt.Healthy(ctx), &he, "a failed group makes the process unhealthy")
	require.ErrorAs(t, he, &gf)

	stopCtx, cancel := context.WithTimeout(ctx, waitLong)
	defer cancel()
	require.ErrorAs(t, g.Stop(stopCtx), &gf, "Stop returns the failure")
}

// A failure that ends the group ends it even while a handler is blocked in
// a call that ignores its context (so its reader cannot stop): Done closes
// with the failure once the handler timeout has passed, and the blocked
// handler is left behind.
func TestAFailureEndsTheGroupWhileAHandlerIsBlocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 1)
	started, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	sys := quietSystem()
	rt := newStopRuntime(t, sys, schema)
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = rt.Stop(c)
	})
	// The timed-out event's dead letter cannot be written: 42P01.
	_, err := pgtest.Pool(t).Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema}.Sanitize()+".dead_letters RENAME TO dead_letters_gone")
	require.NoError(t, err)
	o := GroupOptions{Subscription: "stuck", Category: "acct", Buckets: 1, Worker: "w",
		Handler: blockingHandler(started, release), Lease: fastLease(),
		HandlerTimeout: 100 * time.Millisecond, Retry: RetryPolicy{MaxAttempts: 1}}
	g, err := rt.StartGroup(ctx, o)
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(waitLong):
		t.Fatal("the handler never got the event")
	}
	select {
	case <-g.Done():
	case <-time.After(waitLong):
		t.Fatal("the group is not done after its reader failed, with its handler blocked")
	}
	var gf *GroupFailedError
	require.ErrorAs(t, g.Err(), &gf)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, g.Err(), &pgErr)
	require.Equal(t, "42P01", pgErr.Code)
}

// Group.Stop honours its context while its final lease release is stuck
// (here on lease rows another session has locked): the release is
// abandoned, the leases are left to expire, and nothing waits for the
// database call.
func TestGroupStopHonoursItsContextWhileTheReleaseIsStuck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	o := groupOpts("stuckleave", 1, newRecorder(), "w")
	o.DatabaseTimeout = 10 * time.Minute // the release would wait that long
	w := startWorker(t, schema, "w", o)
	pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 1 }, "w owns the bucket")

	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema}.Sanitize()+".lease_buckets WHERE subscription = 'stuckleave' FOR UPDATE")
	require.NoError(t, err)

	stopCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.group.Stop(stopCtx) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(waitLong):
		t.Fatal("Group.Stop did not return after its context ended")
	}
	require.NoError(t, tx.Commit(ctx))
}

// newStopRuntime starts a runtime on a pool of its own over schema, for a
// test that stops it (the test stops it; nothing here does).
func newStopRuntime(t *testing.T, sys *actor.ActorSystem, schema string) *Runtime {
	t.Helper()
	ws, err := eventsource.New(pgtest.NewPool(t, 8), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	rt, err := startedRuntime(context.Background(), sys, ws, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	return rt
}
