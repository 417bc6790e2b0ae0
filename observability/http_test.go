package observability_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

// promTelemetry is a Telemetry whose metrics go to a fresh Prometheus
// registry, as Setup arranges with the default one.
func promTelemetry(t *testing.T) (*observability.Telemetry, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := promexporter.New(promexporter.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	tel := observability.New(observability.Options{MeterProvider: mp})
	t.Cleanup(func() {
		require.NoError(t, tel.Close())
		require.NoError(t, mp.Shutdown(context.Background()))
	})
	return tel, reg
}

// onLoopback is a request as a server on 127.0.0.1:9464 receives it from
// a client that asked for localhost:9464.
func onLoopback(method, path string) *http.Request {
	r := httptest.NewRequest(method, path, nil)
	r.Host = "localhost:9464"
	return r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey,
		&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9464}))
}

func get(t *testing.T, h http.Handler, path string) (int, string, http.Header) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, onLoopback(http.MethodGet, path))
	return rec.Code, rec.Body.String(), rec.Header()
}

func TestHandler(t *testing.T) {
	tel, reg := promTelemetry(t)
	ctx := context.Background()
	tel.RegisterStatus(func() observability.SubscriptionStatus {
		return observability.SubscriptionStatus{Subscription: "orders", Worker: "w1", Buckets: 4,
			Owned: []observability.BucketStatus{{Bucket: 2, Epoch: 7, State: "live", Checkpoint: 10, LagEvents: 3, LagSeconds: 0.5, QueueDepth: 1}}}
	})
	_, d := tel.StartDelivery(ctx, delivery(2, 1, 1))
	d.End(observability.OutcomeAck, nil)
	tel.OwnershipChange(ctx, observability.OwnershipChange{Kind: observability.ChangeClaim, Subscription: "orders", Bucket: 2, Worker: "w1", Epoch: 7})
	tel.Overflow(ctx, observability.OverflowInfo{Subscription: "orders", Bucket: 2, Policy: obsname.PolicyPauseAndResume, Dropped: 4})

	var unhealthy atomic.Bool
	h := observability.Handler(observability.HandlerOptions{
		Gatherer:  reg,
		Telemetry: tel,
		Healthy: func(context.Context) error {
			if unhealthy.Load() {
				return errors.New("lease store unreachable")
			}
			return nil
		},
	})

	code, body, _ := get(t, h, "/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`kumi_events_delivered_total{kumi_bucket="2",kumi_generation="0",kumi_subscription="orders"`,
		`kumi_events_acked_total{kumi_bucket="2",kumi_generation="0",kumi_subscription="orders"`,
		`kumi_handler_duration_seconds_bucket{kumi_outcome="ack",kumi_subscription="orders"`,
		`kumi_ownership_changes_total{kumi_change="claim",kumi_subscription="orders"`,
		`kumi_queue_overflows_total{kumi_policy="pause_and_resume",kumi_subscription="orders"`,
		`kumi_queue_dropped_total{kumi_policy="pause_and_resume",kumi_subscription="orders"`,
		`kumi_buckets_owned{kumi_subscription="orders",kumi_worker="w1"`,
		`kumi_lag_events{kumi_bucket="2",kumi_generation="0",kumi_subscription="orders"`,
		`kumi_lag_seconds{kumi_bucket="2",kumi_generation="0",kumi_subscription="orders"`,
		`kumi_queue_depth{kumi_bucket="2",kumi_generation="0",kumi_subscription="orders"`,
		`kumi_queue_bytes{kumi_bucket="2",kumi_generation="0",kumi_subscription="orders"`,
	} {
		assert.Contains(t, body, want)
	}
	assert.NotContains(t, body, "0190f2e4", "no event ids on metrics")

	code, body, _ = get(t, h, "/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok\n", body)
	unhealthy.Store(true)
	code, body, _ = get(t, h, "/healthz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "lease store unreachable")

	code, body, hdr := get(t, h, "/status")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "application/json", hdr.Get("Content-Type"))
	var page struct {
		Time          time.Time                          `json:"time"`
		Subscriptions []observability.SubscriptionStatus `json:"subscriptions"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &page))
	require.Len(t, page.Subscriptions, 1)
	assert.Equal(t, "orders", page.Subscriptions[0].Subscription)
	assert.Equal(t, []observability.BucketStatus{{Bucket: 2, Epoch: 7, State: "live", Checkpoint: 10, LagEvents: 3, LagSeconds: 0.5, QueueDepth: 1}}, page.Subscriptions[0].Owned)
	assert.False(t, page.Time.IsZero())
	assert.Contains(t, body, `"lag_events": 3`)

	code, _, _ = get(t, h, "/nope")
	assert.Equal(t, http.StatusNotFound, code)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, onLoopback(http.MethodPost, "/status"))
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}

func TestHandlerCustomStatus(t *testing.T) {
	h := observability.Handler(observability.HandlerOptions{
		Gatherer: prometheus.NewRegistry(),
		Status: func(context.Context) (any, error) {
			return nil, errors.New("coordinator busy")
		},
	})
	code, body, _ := get(t, h, "/status")
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.JSONEq(t, `{"error":"coordinator busy"}`, body)

	// No Telemetry and no Status: an empty page.
	h = observability.Handler(observability.HandlerOptions{Gatherer: prometheus.NewRegistry()})
	code, body, _ = get(t, h, "/status")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"subscriptions": []`)
}

// The hole: on loopback, /status, /metrics and /healthz answered a
// rebinding host name (a web page whose name resolves to 127.0.0.1) with
// the worker's subscriptions, worker ids and checkpoints, and sent errors
// unredacted and without nosniff.
func TestTheEndpointsAnswerOnlyTheirOwnHostAndRedactErrors(t *testing.T) {
	tel, reg := promTelemetry(t)
	tel.RegisterStatus(func() observability.SubscriptionStatus {
		return observability.SubscriptionStatus{Subscription: "orders", Worker: "worker-secret-id", Buckets: 4}
	})
	failing := errors.New("cannot connect to postgres://kumi:hunter2@db:5432/kumi")
	h := observability.Handler(observability.HandlerOptions{Gatherer: reg, Telemetry: tel,
		Healthy: func(context.Context) error { return failing }})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	fetch := func(host, path string, hdr ...string) (int, string, http.Header) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		require.NoError(t, err)
		req.Host = host
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b), resp.Header
	}
	for _, path := range []string{"/status", "/metrics", "/healthz"} {
		code, body, hdr := fetch("rebind.example:9464", path)
		assert.Equal(t, http.StatusMisdirectedRequest, code, path)
		assert.NotContains(t, body, "worker-secret-id", path)
		assert.Equal(t, "nosniff", hdr.Get("X-Content-Type-Options"), path)
		code, _, hdr = fetch(srv.Listener.Addr().String(), path)
		assert.NotEqual(t, http.StatusMisdirectedRequest, code, path)
		assert.Equal(t, "nosniff", hdr.Get("X-Content-Type-Options"), path)
	}
	code, body, _ := fetch("localhost", "/healthz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "cannot connect")
	assert.NotContains(t, body, "hunter2")

	status := observability.Handler(observability.HandlerOptions{Gatherer: prometheus.NewRegistry(),
		Status: func(context.Context) (any, error) { return nil, failing }})
	code, body, _ = get(t, status, "/status")
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.NotContains(t, body, "hunter2")

	// A worker on another address answers that address, or the names
	// it is given.
	at := func(h http.Handler, host string, hdr ...string) int {
		r := httptest.NewRequest(http.MethodGet, "/status", nil)
		r.Host = host
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey,
			&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 9464}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	assert.Equal(t, http.StatusOK, at(h, "10.1.2.3:9464"))
	assert.Equal(t, http.StatusMisdirectedRequest, at(h, "worker-3.internal:9464"))
	assert.Equal(t, http.StatusMisdirectedRequest, at(h, "localhost:9464"))
	named := observability.Handler(observability.HandlerOptions{Gatherer: reg, Telemetry: tel,
		Hosts: []string{"worker-3.internal"}})
	assert.Equal(t, http.StatusOK, at(named, "worker-3.internal:9464"))
}

func TestTheEndpointsTakeAnOptionalBearerToken(t *testing.T) {
	const token = "s3cret-scrape-token"
	h := observability.Handler(observability.HandlerOptions{Gatherer: prometheus.NewRegistry(), Token: token})
	for _, path := range []string{"/status", "/metrics", "/healthz"} {
		code, body, hdr := get(t, h, path)
		assert.Equal(t, http.StatusUnauthorized, code, path)
		assert.Equal(t, `Bearer realm="kumi"`, hdr.Get("WWW-Authenticate"))
		assert.NotContains(t, body, token)
		rec := httptest.NewRecorder()
		r := onLoopback(http.MethodGet, path)
		r.Header.Set("Authorization", "Bearer wrong")
		h.ServeHTTP(rec, r)
		assert.Equal(t, http.StatusUnauthorized, rec.Code, path)
		rec = httptest.NewRecorder()
		r = onLoopback(http.MethodGet, path)
		r.Header.Set("Authorization", "Bearer "+token)
		h.ServeHTTP(rec, r)
		assert.Equal(t, http.StatusOK, rec.Code, path)
	}
}

func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- observability.ServeListener(ctx, ln, observability.Handler(observability.HandlerOptions{Gatherer: prometheus.NewRegistry()}))
	}()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + ln.Addr().String() + "/healthz")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "ok\n", string(b))
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	_, err = client.Get("http://" + ln.Addr().String() + "/healthz")
	require.Error(t, err, "closed")

	// A bad address fails at once.
	err = observability.Serve(context.Background(), "256.0.0.1:bad", http.NotFoundHandler())
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "256.0.0.1") || strings.Contains(err.Error(), "bad"))
}

// /status's JSON is the API (docs/observability.md, "HTTP endpoint"): no
// Go type of it is exported for a caller to decode into, so its keys are
// kept by this test. A field renamed, retagged or dropped changes the
// JSON that scripts and dashboards read; one added must be added here.
func TestTheStatusJSONKeepsItsShape(t *testing.T) {
	tel, reg := promTelemetry(t)
	at := time.Date(2026, 11, 29, 22, 29, 59, 0, time.UTC)
	tel.RegisterStatus(func() observability.SubscriptionStatus {
		return observability.SubscriptionStatus{Subscription: "orders", Worker: "worker-a", Buckets: 8, LiveWorkers: 2, Published: 4230,
			Owned: []observability.BucketStatus{{Generation: 1, Bucket: 1, Slot: 65537, Epoch: 7, State: "reading", Checkpoint: 4211,
				LagEvents: 3, LagSeconds: 0.5, QueueDepth: 1, QueueBytes: 2048,
				Reader: &observability.ReaderStatus{Cursor: 4230, Acked: 4214, Pending: 2, InFlight: 1, NextPending: 4225,
					CatchingUp: true, Bounded: true, Bound: 5000, CutDecided: true, Proposing: true, Draining: true,
					HandlerReady: true, At: at}}}}
	})
	_, body, _ := get(t, observability.Handler(observability.HandlerOptions{Gatherer: reg, Telemetry: tel}), "/status")
	var page map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(body), &page))
	require.Contains(t, page, "time")
	require.JSONEq(t, `[{
		"subscription": "orders", "worker": "worker-a", "buckets": 8, "live_workers": 2, "published": 4230,
		"owned": [{"generation": 1, "bucket": 1, "slot": 65537, "epoch": 7, "state": "reading", "checkpoint": 4211,
			"lag_events": 3, "lag_seconds": 0.5, "queue_depth": 1, "queue_bytes": 2048,
			"reader": {"cursor": 4230, "acked": 4214, "pending": 2, "in_flight": 1, "next_pending": 4225,
				"catching_up": true, "bounded": true, "bound": 5000, "cut_decided": true, "proposing": true, "draining": true,
				"handler_ready": true, "at": "2026-11-29T22:29:59Z"}}]
	}]`, string(page["subscriptions"]))
	require.Len(t, page, 2, "time and subscriptions, nothing else: %s", body)
}
