package actors

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

// runStore is a store on a pool of its own, as a service's would be.
func runStore(t *testing.T, schema string) *eventsource.Store {
	t.Helper()
	store, err := eventsource.New(pgtest.NewPool(t, 12), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	return store
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("StopsGracefullyWhenItsContextEnds", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		admin, schema := newTestStore(t)
		id := appendOne(t, admin, "acct-1", "Deposited", `{"amount":10}`)
		handled := make(chan struct{})
		o := groupOpts("run-graceful", 4, nil, "w")
		o.Worker = "w"
		// Only the graceful stop writes the checkpoint.
		o.CheckpointEvery, o.CheckpointInterval = 1000, time.Hour
		o.Handler = Typed(func(ctx context.Context, d *Delivery, v deposit) error {
			close(handled)
			return nil
		})
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		store := runStore(t, schema)
		done := make(chan error, 1)
		go func() { done <- Run(runCtx, store, RunOptions{Runtime: RuntimeOptions{Logger: testLogger()}}, o) }()
		<-handled
		cancel()
		require.NoError(t, <-done, "a clean stop on the context's end returns nil")

		ev, err := admin.ReadStream(ctx, "acct-1", 0, 1)
		require.NoError(t, err)
		require.Equal(t, id, ev[0].ID)
		cps, err := admin.Checkpoints(ctx, "run-graceful")
		require.NoError(t, err)
		var flushed int64
		for _, c := range cps {
			flushed = max(flushed, c.Position)
		}
		require.Equal(t, ev[0].Position, flushed, "the stop flushed the checkpoint")
		q := pgx.Identifier{schema}.Sanitize()
		var owned, workers int
		require.NoError(t, admin.Pool().QueryRow(ctx, `SELECT count(*) FROM `+q+`.lease_buckets
			WHERE subscription = 'run-graceful' AND owner IS NOT NULL`).Scan(&owned))
		require.NoError(t, admin.Pool().QueryRow(ctx, `SELECT count(*) FROM `+q+`.lease_workers
			WHERE subscription = 'run-graceful'`).Scan(&workers))
		require.Zero(t, owned, "every lease released")
		require.Zero(t, workers, "the worker left the pool")
	})

	t.Run("BoundsTheGracefulStopByStopTimeout", func(t *testing.T) {
		t.Parallel()
		admin, schema := newTestStore(t)
		appendOne(t, admin, "acct-1", "Deposited", `{"amount":10}`)
		blocked := make(chan struct{})
		o := groupOpts("run-bounded", 1, nil, "w")
		o.HandlerTimeout = time.Hour
		o.Handler = Func(func(ctx context.Context, d *Delivery) error {
			close(blocked)
			<-ctx.Done() // until the stop gives up and stops the reader
			return ctx.Err()
		})
		runCtx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := runStore(t, schema)
		done := make(chan error, 1)
		go func() { done <- Run(runCtx, store, RunOptions{StopTimeout: 300 * time.Millisecond}, o) }()
		<-blocked
		cancel()
		err := <-done
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Contains(t, err.Error(), "kumi: graceful stop within 300ms")
	})

	t.Run("ReturnsWhenAGroupEndsOnItsOwnAndStopsTheOthers", func(t *testing.T) {
		t.Parallel()
		_, schema := newTestStore(t)
		a, b := groupOpts("run-a", 1, newRecorder(), "w"), groupOpts("run-b", 1, newRecorder(), "w")
		var others *Group
		err := Run(context.Background(), runStore(t, schema), RunOptions{Started: func(rt *Runtime, groups []*Group) {
			require.Len(t, groups, 2)
			others = groups[1]
			groups[0].Abort()
		}}, a, b)
		require.ErrorIs(t, err, ErrGroupEnded)
		require.Contains(t, err.Error(), "subscription run-a")
		select {
		case <-others.Done():
		default:
			t.Fatal("the other group still runs")
		}
	})

	t.Run("RefusesInvalidOptionsNamingTheGroupAndField", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		var oe *kumierr.ConfigError
		err := Run(ctx, nil, RunOptions{})
		require.ErrorAs(t, err, &oe)
		require.Equal(t, "actors groups", oe.Field)
		bad := groupOpts("run-bad", 0, nil, "w")
		err = Run(ctx, nil, RunOptions{}, groupOpts("run-ok", 1, nil, "w"), bad)
		require.ErrorAs(t, err, &oe)
		require.Equal(t, "actors groups[1].Buckets", oe.Field)
		err = Run(ctx, nil, RunOptions{StopTimeout: -time.Second}, bad)
		require.ErrorAs(t, err, &oe)
		require.Equal(t, "actors.RunOptions.StopTimeout", oe.Field)
	})

	t.Run("ServesMetricsHealthAndStatusOnServe", func(t *testing.T) {
		t.Parallel()
		_, schema := newTestStore(t)
		runCtx, cancel := context.WithCancel(context.Background())
		defer cancel()
		addr := make(chan net.Addr, 1)
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- Run(runCtx, runStore(t, schema), RunOptions{
				Serve:   "127.0.0.1:0",
				Serving: func(a net.Addr) { addr <- a },
				Started: func(*Runtime, []*Group) { close(started) },
			}, groupOpts("run-serve", 4, nil, "w"))
		}()
		base := "http://" + (<-addr).String()
		<-started
		get := func(path string) (int, string) {
			resp, err := http.Get(base + path)
			require.NoError(t, err, path)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(body)
		}
		code, body := get("/healthz")
		require.Equal(t, http.StatusOK, code, body)
		code, body = get("/metrics")
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, "go_goroutines", "the Prometheus exposition")
		pgtest.Eventually(t, 30*time.Second, func() bool {
			var page struct {
				Subscriptions []observability.SubscriptionStatus `json:"subscriptions"`
			}
			code, body = get("/status")
			require.Equal(t, http.StatusOK, code, body)
			require.NoError(t, json.Unmarshal([]byte(body), &page))
			return len(page.Subscriptions) == 1 && page.Subscriptions[0].Subscription == "run-serve" &&
				len(page.Subscriptions[0].Owned) == 4
		}, "/status shows the group owning its 4 buckets")
		cancel()
		require.NoError(t, <-done)
		_, err := http.Get(base + "/healthz")
		require.Error(t, err, "the server stops with Run")
	})

	t.Run("AServeAddressThatCannotBeListenedOnFailsAtOnce", func(t *testing.T) {
		t.Parallel()
		_, schema := newTestStore(t)
		err := Run(context.Background(), runStore(t, schema), RunOptions{Serve: "127.0.0.1:-1"}, groupOpts("run-noserve", 1, nil, "w"))
		require.ErrorContains(t, err, "kumi: RunOptions.Serve:")
	})

	t.Run("AFailedStartStopsWhatStarted", func(t *testing.T) {
		t.Parallel()
		_, schema := newTestStore(t)
		store := runStore(t, schema)
		a := groupOpts("run-start", 1, nil, "w")
		// A second group that cannot start: its session connection's URL
		// does not parse. (Another N is no longer refused: the database's
		// count rules, docs/design/resize.md.)
		b := groupOpts("run-start", 1, nil, "w")
		b.Lease.Kind, b.Lease.SessionURL = leasestore.KindSession, "postgres://%zz"
		err := Run(context.Background(), store, RunOptions{}, a, b)
		require.Error(t, err)
		require.Contains(t, err.Error(), "start groups[1] (run-start)")
		require.False(t, errors.Is(err, ErrGroupEnded))
	})

	// A context that ends while Run starts is a stop, not a failure: a
	// SIGTERM during start-up, or the quickstart's -once when another
	// copy handled its deposit first, exits cleanly.
	t.Run("AContextThatEndsDuringTheStartIsAStop", func(t *testing.T) {
		t.Parallel()
		_, schema := newTestStore(t)
		store := runStore(t, schema)
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		require.NoError(t, Run(ended, store, RunOptions{}, groupOpts("run-ended", 1, nil, "w")), "ended before the runtime started")

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Serving is called after the runtime started, before the groups do.
		err := Run(ctx, store, RunOptions{Serve: "127.0.0.1:0", Serving: func(net.Addr) { cancel() }},
			groupOpts("run-ended", 1, nil, "w"))
		require.NoError(t, err, "ended while the groups started")
	})
}
