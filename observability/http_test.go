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

func get(t *testing.T, h http.Handler, path string) (int, string, http.Header) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
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
	tel.Overflow(ctx, observability.OverflowInfo{Subscription: "orders", Bucket: 2, Policy: observability.PolicyPauseAndResume, Dropped: 4})

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
		`kumi_events_delivered_total{kumi_bucket="2",kumi_subscription="orders"`,
		`kumi_events_acked_total{kumi_bucket="2",kumi_subscription="orders"`,
		`kumi_handler_duration_seconds_bucket{kumi_outcome="ack",kumi_subscription="orders"`,
		`kumi_ownership_changes_total{kumi_change="claim",kumi_subscription="orders"`,
		`kumi_queue_overflows_total{kumi_policy="pause_and_resume",kumi_subscription="orders"`,
		`kumi_queue_dropped_total{kumi_policy="pause_and_resume",kumi_subscription="orders"`,
		`kumi_buckets_owned{kumi_subscription="orders",kumi_worker="w1"`,
		`kumi_lag_events{kumi_bucket="2",kumi_subscription="orders"`,
		`kumi_lag_seconds{kumi_bucket="2",kumi_subscription="orders"`,
		`kumi_queue_depth{kumi_bucket="2",kumi_subscription="orders"`,
		`kumi_queue_bytes{kumi_bucket="2",kumi_subscription="orders"`,
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
	var page observability.StatusPage
	require.NoError(t, json.Unmarshal([]byte(body), &page))
	require.Len(t, page.Subscriptions, 1)
	assert.Equal(t, "orders", page.Subscriptions[0].Subscription)
	assert.Equal(t, []observability.BucketStatus{{Bucket: 2, Epoch: 7, State: "live", Checkpoint: 10, LagEvents: 3, LagSeconds: 0.5, QueueDepth: 1}}, page.Subscriptions[0].Owned)
	assert.False(t, page.Time.IsZero())
	assert.Contains(t, body, `"lag_events": 3`)

	code, _, _ = get(t, h, "/nope")
	assert.Equal(t, http.StatusNotFound, code)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/status", nil))
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
