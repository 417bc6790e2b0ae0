package jaegertest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/jaegertest"
	"github.com/kumi-run/kumi/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// fakeJaeger serves testdata/traces.json (recorded from Jaeger v1.76.0)
// after `after` requests, and records the last query.
func fakeJaeger(t *testing.T, after int32) (*httptest.Server, *atomic.Value) {
	t.Helper()
	fixture, err := os.ReadFile("testdata/traces.json")
	require.NoError(t, err)
	var calls atomic.Int32
	var last atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/services":
			_ = json.NewEncoder(w).Encode(map[string]any{"data": []string{"kumi-fixture"}})
		case "/api/traces":
			last.Store(r.URL.Query())
			if calls.Add(1) <= after {
				_, _ = w.Write([]byte(`{"data":[],"errors":null}`))
				return
			}
			_, _ = w.Write(fixture)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &last
}

func TestQueryTracesDecodes(t *testing.T) {
	srv, last := fakeJaeger(t, 0)
	ctx := context.Background()
	traces, err := jaegertest.QueryTraces(ctx, srv.URL, "kumi-fixture",
		jaegertest.WithOperation("kumi.deliver"), jaegertest.WithTag("kumi.bucket", "3"), jaegertest.Limit(7))
	require.NoError(t, err)
	require.NotEmpty(t, traces)

	q := last.Load().(url.Values)
	assert.Equal(t, []string{"kumi-fixture"}, q["service"])
	assert.Equal(t, []string{"kumi.deliver"}, q["operation"])
	assert.Equal(t, []string{`{"kumi.bucket":"3"}`}, q["tags"])
	assert.Equal(t, []string{"7"}, q["limit"])

	spans := jaegertest.Spans(traces)
	take := jaegertest.Filter(spans, jaegertest.Operation("kumi.lease.handoff.take"))
	require.Len(t, take, 1)
	assert.Equal(t, "kumi-fixture", take[0].Service)
	assert.Equal(t, "worker-b", take[0].Tag("kumi.worker"))
	epoch, ok := take[0].Int("kumi.epoch")
	assert.True(t, ok)
	assert.EqualValues(t, 7, epoch)
	assert.Equal(t, "3", take[0].Tag("kumi.bucket"))
	assert.Equal(t, "", take[0].Tag("no.such.tag"))
	assert.False(t, take[0].HasTag("no.such.tag"))

	rec := jaegertest.Filter(spans, jaegertest.Operation("kumi.reconcile"))
	require.Len(t, rec, 1)
	assert.Equal(t, rec[0].SpanID, take[0].ParentSpanID)
	assert.Empty(t, rec[0].ParentSpanID)
	assert.False(t, rec[0].Start.IsZero())

	dead := jaegertest.Filter(spans, jaegertest.Tagged("kumi.outcome", "dead_letter"))
	require.Len(t, dead, 1)
	require.Len(t, dead[0].Events, 1)
	assert.Equal(t, "kumi.dead_letter", dead[0].Events[0].Name)
	assert.Equal(t, "retry budget spent", dead[0].Events[0].Fields["kumi.reason"])

	for i := 1; i < len(spans); i++ {
		assert.False(t, spans[i].Start.Before(spans[i-1].Start), "Spans sorts by start")
	}
}

func TestWaitForSpansPolls(t *testing.T) {
	srv, _ := fakeJaeger(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	spans, err := jaegertest.WaitForSpans(ctx, srv.URL, "kumi-fixture", func(s []jaegertest.Span) bool {
		return len(jaegertest.Filter(s, jaegertest.Operation("kumi.deliver"))) == 2
	}, jaegertest.PollInterval(10*time.Millisecond))
	require.NoError(t, err)
	assert.NotEmpty(t, spans)
}

func TestWaitForSpansTimesOut(t *testing.T) {
	srv, _ := fakeJaeger(t, 1<<30)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := jaegertest.WaitForSpans(ctx, srv.URL, "kumi-fixture", func(s []jaegertest.Span) bool { return len(s) > 0 },
		jaegertest.PollInterval(10*time.Millisecond))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestServicesAndErrors(t *testing.T) {
	srv, _ := fakeJaeger(t, 0)
	ctx := context.Background()
	svcs, err := jaegertest.Services(ctx, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, []string{"kumi-fixture"}, svcs)
	require.NoError(t, jaegertest.Ready(ctx, srv.URL+"/"))

	_, err = jaegertest.QueryTraces(ctx, srv.URL+"/nope", "x")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "404")
}
