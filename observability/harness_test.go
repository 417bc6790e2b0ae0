package observability_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/internal/leaktest"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// harness is a Telemetry wired to the SDK's in-memory exporter and a
// manual metric reader.
type harness struct {
	tel    *observability.Telemetry
	tp     *sdktrace.TracerProvider
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	logs   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader(), logs: &syncBuffer{}}
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(h.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	h.tel = observability.New(observability.Options{
		TracerProvider: h.tp,
		MeterProvider:  mp,
		Logger:         slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	t.Cleanup(func() {
		require.NoError(t, h.tel.Close())
		require.NoError(t, h.tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
	return h
}

// ended returns the ended spans named name.
func (h *harness) ended(name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range h.spans.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func (h *harness) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, h.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, obsname.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// matches reports whether set has every attribute of want.
func matches(set attribute.Set, want map[string]any) bool {
	for k, v := range want {
		got, ok := set.Value(attribute.Key(k))
		if !ok || got.AsInterface() != v {
			return false
		}
	}
	return true
}

// sum adds the int64 data points of a sum or gauge metric whose attributes
// include want (int values as int64).
func sum(t *testing.T, ms map[string]metricdata.Metrics, name string, want map[string]any) int64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		return 0
	}
	var pts []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		pts = d.DataPoints
	case metricdata.Gauge[int64]:
		pts = d.DataPoints
	default:
		t.Fatalf("%s: unexpected data %T", name, m.Data)
	}
	var n int64
	for _, p := range pts {
		if matches(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// histCount counts the observations of a histogram whose attributes
// include want.
func histCount(t *testing.T, ms map[string]metricdata.Metrics, name string, want map[string]any) uint64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		return 0
	}
	d, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s: %T", name, m.Data)
	var n uint64
	for _, p := range d.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Count
		}
	}
	return n
}

// attrs maps a span's attributes for assertions (ints as int64).
func attrs(s tracetest.SpanStub) map[string]any {
	out := map[string]any{}
	for _, kv := range s.Attributes {
		out[string(kv.Key)] = kv.Value.AsInterface()
	}
	return out
}
