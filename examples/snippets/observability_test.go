package snippets

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/jaegertest"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/observability/otelsetup"
)

// setupAndServe is docs/observability.md's configuration.
func setupAndServe(ctx context.Context, store *eventsource.Store, addr string, groups ...actors.GroupOptions) error {
	// snippet: docs/observability.md
	shutdown, err := otelsetup.Setup(ctx, otelsetup.Options{ServiceName: "orders-projector"})
	if err != nil {
		return err
	}
	defer shutdown(context.Background())

	// Serve: GET /metrics, /healthz and /status on addr (say "127.0.0.1:9464")
	// while Run runs, with the runtime's own telemetry.
	return actors.Run(ctx, store, actors.RunOptions{Serve: addr}, groups...)
	// end snippet
}

// onOwnMux is docs/observability.md's handler on a service's own mux.
func onOwnMux(ctx context.Context, store *eventsource.Store, mux *http.ServeMux, groups ...actors.GroupOptions) error {
	// snippet: docs/observability.md
	tel := observability.New(observability.Options{}) // nil providers: the globals Setup installed
	defer tel.Close()
	mux.Handle("/ops/", http.StripPrefix("/ops", observability.Handler(observability.HandlerOptions{Telemetry: tel})))
	// The same tel to the runtime: without it, /status would list nothing.
	return actors.Run(ctx, store, actors.RunOptions{Runtime: actors.RuntimeOptions{Telemetry: tel}}, groups...)
	// end snippet
}

// newStore is a store on a schema of its own, migrated.
func newStore(t *testing.T) *eventsource.Store {
	t.Helper()
	store, err := eventsource.New(pgtest.NewPool(t, 12), eventsource.Config{Schema: pgtest.NewSchema(t)})
	require.NoError(t, err)
	require.NoError(t, actors.Migrate(context.Background(), store))
	return store
}

// orders is the group the snippets run: it handles every event.
func orders() actors.GroupOptions {
	return actors.GroupOptions{Subscription: "orders", Category: "order", Buckets: 4,
		Handler: actors.Func(func(context.Context, *actors.Delivery) error { return nil })}
}

// get returns an URL's status and body; status 0 when it cannot connect.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// running runs f in the background until the test ends, and fails the
// test if f returns an error other than the end of its context.
func running(t *testing.T, f func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// Setup's globals are the process's: this is the one test that calls it.
func TestSetupAndServe(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	running(t, func(ctx context.Context) error { return setupAndServe(ctx, store, addr, orders()) })

	_, err = store.Append(context.Background(), "order-1", eventsource.Any, []eventsource.EventData{{Type: "Placed", Data: []byte(`{}`)}})
	require.NoError(t, err)
	pgtest.Eventually(t, time.Minute, func() bool {
		code, body := get(t, "http://"+addr+"/status")
		return code == http.StatusOK && strings.Contains(body, `"subscription": "orders"`) && strings.Count(body, `"bucket"`) == 4
	}, "/status shows the group owning its 4 buckets")
	pgtest.Eventually(t, time.Minute, func() bool {
		code, body := get(t, "http://"+addr+"/metrics")
		return code == http.StatusOK && strings.Contains(body, "kumi_")
	}, "/metrics has kumi's metrics, through the exporter Setup registered")
	code, body := get(t, "http://"+addr+"/healthz")
	require.Equal(t, http.StatusOK, code, body)
}

func TestOnOwnMux(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	started := make(chan struct{})
	running(t, func(ctx context.Context) error {
		g := orders()
		g.Subscription = "orders-mux"
		go func() { // the snippet mounts the handler, then runs
			pgtest.Eventually(t, time.Minute, func() bool { code, _ := get(t, srv.URL+"/ops/healthz"); return code == http.StatusOK },
				"the handler is mounted")
			close(started)
		}()
		return onOwnMux(ctx, store, mux, g)
	})
	<-started
	pgtest.Eventually(t, time.Minute, func() bool {
		code, body := get(t, srv.URL+"/ops/status")
		return code == http.StatusOK && strings.Contains(body, `"subscription": "orders-mux"`)
	}, "/ops/status shows the group: the runtime records to the handler's telemetry")
}

// waitForHandoff is docs/observability.md's jaegertest query.
func waitForHandoff(ctx context.Context) (int64, error) {
	// snippet: docs/observability.md
	spans, err := jaegertest.WaitForSpans(ctx, os.Getenv("KUMI_JAEGER_URL"), "kumi-e2e",
		func(s []jaegertest.Span) bool {
			return len(jaegertest.Filter(s, jaegertest.Operation("kumi.lease.handoff.take"),
				jaegertest.Tagged("kumi.bucket", "3"))) > 0
		})
	take := jaegertest.Filter(spans, jaegertest.Operation("kumi.lease.handoff.take"))[0]
	epoch, _ := take.Int("kumi.epoch")
	// end snippet
	return epoch, err
}

// The query runs against a stand-in for Jaeger's query API that answers one
// trace in Jaeger's JSON (the real one: TestRealJaeger, with make jaeger).
func TestWaitForHandoff(t *testing.T) {
	jaeger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/traces" || r.URL.Query().Get("service") != "kumi-e2e" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"data": [{"traceID": "t1", "spans": [{"traceID": "t1", "spanID": "s1",
			"operationName": "kumi.lease.handoff.take", "references": [], "startTime": 1795990991385164, "duration": 3,
			"tags": [{"key": "kumi.bucket", "type": "int64", "value": 3}, {"key": "kumi.epoch", "type": "int64", "value": 7}],
			"logs": [], "processID": "p1"}], "processes": {"p1": {"serviceName": "kumi-e2e", "tags": []}}}]}`))
	}))
	t.Cleanup(jaeger.Close)
	t.Setenv("KUMI_JAEGER_URL", jaeger.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	epoch, err := waitForHandoff(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 7, epoch)
}
