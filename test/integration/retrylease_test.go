package integration

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/supervision"
)

// TestRetriedDeliveryRechecksItsLease: a handler that keeps asking for a
// retry must stop being called once its worker can no longer be sure of
// the bucket. (This harness found that a retry skipped EnsureHeld; fixed
// in actors, commit 9fe9fc6 — this is its regression test.) The network-cut scenario can only hit this by chance (a
// delivery must be in flight when the cut comes); here it is made certain,
// in one process: one bucket, one event whose handler always answers
// Retry, and then the lease row is locked by another transaction, so
// every renewal hangs and is abandoned — the situation of a worker cut off
// from the database, or whose renewals time out. By the rule of
// EnsureHeld (docs/design/leases.md) no delivery may start later than the last
// landed renewal's start + TTL − Margin.
func TestRetriedDeliveryRechecksItsLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	schema := pgtest.NewSchema(t)
	pool := pgtest.NewPool(t, 10)
	if err := prepareSchema(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	rt, err := actors.New(system, store, actors.RuntimeOptions{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.Stop(context.Background()) }()

	var mu sync.Mutex
	var attempts []time.Time
	recovered := false // then the handler acks, so that the group can stop
	handler := actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*actors.Delivery); ok {
			mu.Lock()
			attempts = append(attempts, time.Now())
			ok := recovered
			mu.Unlock()
			if ok {
				c.Respond(actors.Ack{})
				return
			}
			c.Respond(actors.Retry{After: 100 * time.Millisecond, Reason: "downstream unavailable"})
		}
	})
	lease := defaultLease()
	group, err := rt.StartGroup(ctx, actors.GroupOptions{
		Subscription: "retry", Category: categoryName, Buckets: 1, Worker: "solo", Handler: handler,
		Lease: leasestore.LeaseOptions{TTL: lease.TTL, Heartbeat: lease.Heartbeat, Margin: lease.Margin},
		Retry: actors.RetryPolicy{MaxAttempts: 1000, Backoff: supervision.Backoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = group.Stop(context.Background()) }()
	if _, err := store.Append(ctx, categoryName+"-1", eventsource.Any,
		[]eventsource.EventData{{Type: "Stuck", Data: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(attempts) }
	pgtest.Eventually(t, 30*time.Second, func() bool { return count() >= 3 }, "the handler is retried (%d attempts)", count())

	// Every renewal from now on hangs on the row lock and is abandoned.
	lockTx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lockTx.Rollback(context.Background()) }()
	if _, err := lockTx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s.lease_buckets WHERE subscription = 'retry' FOR UPDATE`,
		pgx.Identifier{schema}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	locked := time.Now()
	time.Sleep(2 * lease.TTL)
	lastPass := lastHeartbeat(ctx, t, pool, schema, "retry", "solo")
	mustStop := lastPass.Add(lease.TTL - lease.Margin)
	_ = lockTx.Rollback(ctx)

	// Allow for the time between the reader sending a delivery and the
	// handler receiving it.
	const slack = 300 * time.Millisecond
	mu.Lock()
	late := 0
	var first time.Time
	for _, a := range attempts {
		if a.After(mustStop.Add(slack)) && a.Before(locked.Add(2*lease.TTL)) {
			if late == 0 {
				first = a
			}
			late++
		}
	}
	total := len(attempts)
	recovered = true
	mu.Unlock()
	if late > 0 {
		t.Errorf("%d of %d deliveries started after the worker's lease could no longer be trusted "+
			"(last landed renewal %s + TTL − Margin = %s), the first at %s: a retried delivery does not "+
			"re-check EnsureHeld (actors/reader.go, case *redeliver → send)",
			late, total, lastPass.Format(time.StampMilli), mustStop.Format(time.StampMilli), first.Format(time.StampMilli))
	}
}

// lastHeartbeat is the start of the worker's last pass that landed.
func lastHeartbeat(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema, sub, worker string) time.Time {
	t.Helper()
	var at time.Time
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT heartbeat_at FROM %s.lease_workers WHERE subscription = $1 AND worker = $2`,
		pgx.Identifier{schema}.Sanitize()), sub, worker).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}
