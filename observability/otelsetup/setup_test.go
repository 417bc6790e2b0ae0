package otelsetup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/internal/leaktest"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/observability/otelsetup"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// These tests change otel's globals; none of them runs in parallel.

// clearOTelEnv blanks the variables Setup reads (empty counts as unset).
func clearOTelEnv(t *testing.T) {
	for _, k := range []string{
		"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "KUMI_TRACES_FILE",
	} {
		t.Setenv(k, "")
	}
}

func TestSetupWithoutEndpointInstallsNoTracer(t *testing.T) {
	clearOTelEnv(t)
	reg := prometheus.NewRegistry()
	shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{Registerer: reg})
	require.NoError(t, err)
	defer func() { require.NoError(t, shutdown(context.Background())) }()

	_, isSDK := otel.GetTracerProvider().(*sdktrace.TracerProvider)
	assert.False(t, isSDK, "no exporter: no tracer provider")
	_, isSDKMeter := otel.GetMeterProvider().(*sdkmetric.MeterProvider)
	assert.True(t, isSDKMeter, "Prometheus metrics by default")
	assert.ElementsMatch(t, []string{"traceparent", "tracestate", "baggage"}, otel.GetTextMapPropagator().Fields())

	tel := observability.New(observability.Options{})
	defer tel.Close()
	_, d := tel.StartDelivery(context.Background(), observability.DeliveryInfo{Subscription: "orders", Category: "order", Bucket: 1, Position: 1, Attempt: 1})
	d.End(observability.OutcomeAck, nil)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	assert.True(t, names["kumi_events_delivered_total"], "%v", names)
	assert.True(t, names["target_info"])
}

// otlpReceiver is a minimal OTLP/HTTP endpoint that records what it gets.
type otlpReceiver struct {
	mu     sync.Mutex
	paths  []string
	bodies [][]byte
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.paths = append(r.paths, req.URL.Path)
	r.bodies = append(r.bodies, b)
	r.mu.Unlock()
	// No keep-alive: the exporter's shared transport would keep a
	// connection (and two goroutines) past the test.
	w.Header().Set("Connection", "close")
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

func (r *otlpReceiver) all() ([]string, []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.paths...), bytes.Join(r.bodies, nil)
}

func TestSetupExportsOTLPHTTPFromEnv(t *testing.T) {
	clearOTelEnv(t)
	rcv := &otlpReceiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "kumi-setup-test")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	meterMarker := otel.GetMeterProvider()

	shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{})
	require.NoError(t, err)
	_, isSDK := otel.GetTracerProvider().(*sdktrace.TracerProvider)
	require.True(t, isSDK)
	assert.Same(t, meterMarker, otel.GetMeterProvider(), "OTEL_METRICS_EXPORTER=none installs no meter provider")

	tel := observability.New(observability.Options{})
	defer tel.Close()
	tel.OwnershipChange(context.Background(), observability.OwnershipChange{
		Kind: observability.ChangeClaim, Subscription: "orders", Bucket: 5, Worker: "w1", Epoch: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx), "shutdown flushes")
	require.NoError(t, shutdown(ctx), "and is idempotent")

	paths, body := rcv.all()
	require.NotEmpty(t, paths)
	assert.Equal(t, "/v1/traces", paths[0])
	// Protobuf keeps strings verbatim.
	assert.Contains(t, string(body), "kumi.lease.claim")
	assert.Contains(t, string(body), "kumi-setup-test")
	assert.Contains(t, string(body), obsname.ScopeName)
}

// Without a collector, KUMI_TRACES_FILE appends every span to a file as a
// line of JSON: two processes' setups (here, one after the other) share it.
func TestSetupWritesSpansToAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "traces.jsonl")
	for i, worker := range []string{"w1", "w2"} {
		clearOTelEnv(t)
		t.Setenv("KUMI_TRACES_FILE", path)
		t.Setenv("OTEL_METRICS_EXPORTER", "none")
		shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{ServiceName: "kumi-file-test"})
		require.NoError(t, err)
		tel := observability.New(observability.Options{})
		tel.OwnershipChange(context.Background(), observability.OwnershipChange{
			Kind: observability.ChangeClaim, Subscription: "orders", Bucket: i, Worker: worker, Epoch: 1})
		tel.Close()
		require.NoError(t, shutdown(context.Background()))
	}
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Len(t, lines, 2, "one line a span, appended:\n%s", raw)
	for i, line := range lines {
		var span struct {
			Name       string
			Attributes []struct {
				Key   string
				Value struct{ Value any }
			}
		}
		require.NoError(t, json.Unmarshal([]byte(line), &span), line)
		require.Equal(t, "kumi.lease.claim", span.Name)
		require.Contains(t, line, fmt.Sprintf(`"w%d"`, i+1))
	}

	clearOTelEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "file")
	_, err = otelsetup.Setup(context.Background(), otelsetup.Options{Registerer: prometheus.NewRegistry()})
	require.ErrorContains(t, err, "needs KUMI_TRACES_FILE")
	clearOTelEnv(t)
	t.Setenv("KUMI_TRACES_FILE", filepath.Join(t.TempDir(), "no", "such", "dir", "t.jsonl"))
	_, err = otelsetup.Setup(context.Background(), otelsetup.Options{Registerer: prometheus.NewRegistry()})
	require.ErrorContains(t, err, "KUMI_TRACES_FILE")
}

func TestSetupGRPCProtocol(t *testing.T) {
	clearOTelEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // nothing listens; export is lazy
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{})
	require.NoError(t, err)
	_, isSDK := otel.GetTracerProvider().(*sdktrace.TracerProvider)
	assert.True(t, isSDK)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx))
}

func TestSetupEnvChoices(t *testing.T) {
	t.Run("unsupported protocol", func(t *testing.T) {
		clearOTelEnv(t)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
		_, err := otelsetup.Setup(context.Background(), otelsetup.Options{Registerer: prometheus.NewRegistry()})
		require.ErrorContains(t, err, `unsupported OTLP protocol "http/json"`)
	})
	t.Run("unsupported exporters are logged and off", func(t *testing.T) {
		clearOTelEnv(t)
		otel.SetTracerProvider(sdktrace.NewTracerProvider()) // a marker to see it is not replaced
		marker := otel.GetTracerProvider()
		t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
		t.Setenv("OTEL_METRICS_EXPORTER", "otlp")
		var logs bytes.Buffer // Setup logs these before it returns
		shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		require.NoError(t, shutdown(context.Background()))
		assert.Same(t, marker, otel.GetTracerProvider())
		assert.Contains(t, logs.String(), "unsupported OTEL_TRACES_EXPORTER")
		assert.Contains(t, logs.String(), "unsupported OTEL_METRICS_EXPORTER")
	})
	t.Run("traces none", func(t *testing.T) {
		clearOTelEnv(t)
		marker := otel.GetTracerProvider()
		t.Setenv("OTEL_TRACES_EXPORTER", "none")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{Registerer: prometheus.NewRegistry()})
		require.NoError(t, err)
		require.NoError(t, shutdown(context.Background()))
		assert.Same(t, marker, otel.GetTracerProvider())
	})
	t.Run("sdk disabled", func(t *testing.T) {
		clearOTelEnv(t)
		marker, meterMarker := otel.GetTracerProvider(), otel.GetMeterProvider()
		t.Setenv("OTEL_SDK_DISABLED", "true")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{Registerer: prometheus.NewRegistry()})
		require.NoError(t, err)
		require.NoError(t, shutdown(context.Background()))
		assert.Same(t, marker, otel.GetTracerProvider())
		assert.Same(t, meterMarker, otel.GetMeterProvider())
		assert.IsType(t, propagation.NewCompositeTextMapPropagator(), otel.GetTextMapPropagator())
	})
}

func TestSetupSpanExporterOption(t *testing.T) {
	clearOTelEnv(t)
	exp := tracetest.NewInMemoryExporter()
	shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{
		SpanExporter: exp, ServiceName: "kumi-inmem", ServiceVersion: "v0.0.1", Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	tel := observability.New(observability.Options{})
	defer tel.Close()
	ctx, pass := tel.StartReconcile(context.Background(), "orders", "w1")
	tel.OwnershipChange(ctx, observability.OwnershipChange{Kind: observability.ChangeRelease, Subscription: "orders", Bucket: 1, Worker: "w1", Epoch: 3})
	pass.End(observability.PassSummary{Released: 1})
	require.NoError(t, otel.GetTracerProvider().(*sdktrace.TracerProvider).ForceFlush(context.Background()))
	spans := exp.GetSpans() // before shutdown, which empties the exporter
	require.NoError(t, shutdown(context.Background()))
	require.Len(t, spans, 2)
	res := map[string]string{}
	for _, kv := range spans[0].Resource.Attributes() {
		res[string(kv.Key)] = kv.Value.String()
	}
	assert.Equal(t, "kumi-inmem", res["service.name"])
	assert.Equal(t, "v0.0.1", res["service.version"])
}
