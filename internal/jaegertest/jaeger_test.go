//go:build jaeger

package jaegertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/jaegertest"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

// TestRealJaeger exports kumi spans over OTLP/HTTP to a running Jaeger and
// reads them back through its query API. It is built with the jaeger tag
// and needs KUMI_JAEGER_URL: `make test-jaeger` starts Jaeger and sets it.
func TestRealJaeger(t *testing.T) {
	base := os.Getenv("KUMI_JAEGER_URL")
	if base == "" {
		t.Fatal("KUMI_JAEGER_URL is not set: run `make test-jaeger`, which starts Jaeger and sets it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &http.Client{}
	defer client.CloseIdleConnections()
	require.NoError(t, jaegertest.Ready(ctx, base, jaegertest.WithClient(client)))

	service := fmt.Sprintf("kumi-jaegertest-%d", time.Now().UnixNano())
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithHTTPClient(client)) // OTEL_EXPORTER_OTLP_ENDPOINT
	require.NoError(t, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	tel := observability.New(observability.Options{TracerProvider: tp})
	defer tel.Close()

	// An ownership change inside a reconcile pass.
	pctx, pass := tel.StartReconcile(ctx, "orders", "worker-b")
	tel.OwnershipChange(pctx, observability.OwnershipChange{
		Kind: observability.ChangeHandoffTake, Subscription: "orders", Bucket: 3,
		Worker: "worker-b", Peer: "worker-a", Epoch: 7, Reason: "handoff"})
	pass.End(observability.PassSummary{LiveWorkers: 2, FairShare: 2, Owned: 2, Taken: 1})

	// An append's trace context travels in metadata to the delivery.
	actx, appendSpan := tp.Tracer("app").Start(ctx, "append")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(actx, carrier)
	md, err := json.Marshal(carrier)
	require.NoError(t, err)
	appendSpan.End()
	dctx := eventsource.TraceContext(ctx, md)
	_, d := tel.StartDelivery(dctx, observability.DeliveryInfo{
		Subscription: "orders", Bucket: 3, Worker: "worker-b", Category: "order",
		Stream: "order-1", EventID: "0192", EventType: "Placed", Position: 42, Attempt: 1})
	d.End(observability.OutcomeAck, nil)
	_, d = tel.StartDelivery(ctx, observability.DeliveryInfo{
		Subscription: "orders", Bucket: 3, Worker: "worker-b", Stream: "order-2", Position: 43, Attempt: 5})
	d.End(observability.OutcomeDeadLetter, errors.New("retry budget spent"))

	require.NoError(t, tp.Shutdown(ctx))

	spans, err := jaegertest.WaitForSpans(ctx, base, service, func(s []jaegertest.Span) bool {
		return len(jaegertest.Filter(s, jaegertest.Operation(obsname.SpanLeaseHandoffTake))) == 1 &&
			len(jaegertest.Filter(s, jaegertest.Operation(obsname.SpanDeliver))) == 2 &&
			len(jaegertest.Filter(s, jaegertest.Operation("append"))) == 1
	}, jaegertest.WithClient(client))
	require.NoError(t, err)

	take := jaegertest.Filter(spans, jaegertest.Operation(obsname.SpanLeaseHandoffTake))[0]
	assert.Equal(t, service, take.Service)
	assert.Equal(t, "3", take.Tag(obsname.AttrBucket))
	assert.Equal(t, "worker-b", take.Tag(obsname.AttrWorker))
	assert.Equal(t, "worker-a", take.Tag(obsname.AttrPeer))
	epoch, ok := take.Int(obsname.AttrEpoch)
	assert.True(t, ok)
	assert.EqualValues(t, 7, epoch)
	rec := jaegertest.Filter(spans, jaegertest.Operation(obsname.SpanReconcile))
	require.Len(t, rec, 1)
	assert.Equal(t, rec[0].SpanID, take.ParentSpanID, "the change is a child of its reconcile pass")

	app := jaegertest.Filter(spans, jaegertest.Operation("append"))[0]
	del := jaegertest.Filter(spans, jaegertest.Operation(obsname.SpanDeliver), jaegertest.Tagged(obsname.AttrPosition, "42"))[0]
	assert.Equal(t, app.TraceID, del.TraceID, "delivery joins the appender's trace")
	assert.Equal(t, app.SpanID, del.ParentSpanID)
	assert.Equal(t, "ack", del.Tag(obsname.AttrOutcome))
	assert.Equal(t, "42", del.Tag(obsname.AttrPosition))

	dead := jaegertest.Filter(spans, jaegertest.Operation(obsname.SpanDeliver), jaegertest.Tagged(obsname.AttrOutcome, "dead_letter"))
	require.Len(t, dead, 1)
	assert.Empty(t, dead[0].ParentSpanID, "no trace context: a root span")
	require.Len(t, dead[0].Events, 1)
	assert.Equal(t, obsname.EventDeadLetter, dead[0].Events[0].Name)
	assert.Equal(t, "retry budget spent", dead[0].Events[0].Fields[obsname.AttrReason])
	assert.Equal(t, "ERROR", dead[0].Tag("otel.status_code"))

	// Tag queries work too.
	traces, err := jaegertest.QueryTraces(ctx, base, service,
		jaegertest.WithOperation(obsname.SpanLeaseHandoffTake),
		jaegertest.WithTag(obsname.AttrBucket, "3"), jaegertest.WithClient(client))
	require.NoError(t, err)
	assert.Len(t, traces, 1)
}
