//go:build jaeger

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/jaegertest"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// exporter returns a tracer provider exporting over OTLP/HTTP (to
// OTEL_EXPORTER_OTLP_ENDPOINT) as service.
func exporter(t *testing.T, service string) *sdktrace.TracerProvider {
	t.Helper()
	client := &http.Client{}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithHTTPClient(client))
	require.NoError(t, err)
	t.Cleanup(client.CloseIdleConnections)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(100*time.Millisecond)),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

type worker struct {
	rt    *actors.Runtime
	group *actors.Group
	sys   *actor.ActorSystem
	tp    *sdktrace.TracerProvider
}

func startWorker(t *testing.T, schema, service, name string, handled chan<- string) *worker {
	t.Helper()
	ctx := context.Background()
	w := &worker{sys: actor.NewActorSystem(actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(slog.New(slog.DiscardHandler)))),
		tp: exporter(t, service)}
	store, err := eventsource.New(pgtest.NewPool(t, 8), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	tel := observability.New(observability.Options{TracerProvider: w.tp, Logger: slog.New(slog.DiscardHandler)})
	w.rt, err = actors.New(w.sys, store, actors.RuntimeOptions{Telemetry: tel})
	require.NoError(t, err)
	require.NoError(t, w.rt.Start(ctx))
	w.group, err = w.rt.StartGroup(ctx, actors.GroupOptions{
		Subscription: "e2e", Category: "order", Buckets: 4, Worker: name,
		Lease: leasestore.LeaseOptions{TTL: 2 * time.Second, Heartbeat: 200 * time.Millisecond, Margin: 600 * time.Millisecond},
		Handler: actor.PropsFromFunc(func(ctx actor.Context) {
			if d, ok := ctx.Message().(*actors.Delivery); ok {
				handled <- d.Event.ID.String()
				ctx.Respond(actors.Ack{})
			}
		}),
	})
	require.NoError(t, err)
	return w
}

func (w *worker) owned(t *testing.T) int {
	st, err := w.group.Status(context.Background())
	require.NoError(t, err)
	return len(st.Owned)
}

// TestJaegerSeesOwnershipChangesAndJoinedDeliveries: two workers and a
// producer export to a real Jaeger; a handoff (b joins) and a failover (a
// dies without a word) are forced; Jaeger's query API then shows the
// ownership-change spans with bucket, worker and epoch, and a delivery span
// in the producer's trace, a child of its append span.
func TestJaegerSeesOwnershipChangesAndJoinedDeliveries(t *testing.T) {
	base := os.Getenv("KUMI_JAEGER_URL")
	if base == "" {
		t.Fatal("KUMI_JAEGER_URL is not set: run `make test-jaeger`, which starts Jaeger and sets it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := &http.Client{}
	defer client.CloseIdleConnections()
	require.NoError(t, jaegertest.Ready(ctx, base, jaegertest.WithClient(client)))
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	svcA, svcB, svcP := "kumi-e2e-a-"+run, "kumi-e2e-b-"+run, "kumi-e2e-producer-"+run
	schema := pgtest.NewSchema(t)
	handled := make(chan string, 1000)

	a := startWorker(t, schema, svcA, "a-"+run, handled)
	pgtest.Eventually(t, time.Minute, func() bool { return a.owned(t) == 4 }, "a owns all four buckets")
	b := startWorker(t, schema, svcB, "b-"+run, handled)
	pgtest.Eventually(t, time.Minute, func() bool { return a.owned(t) == 2 && b.owned(t) == 2 }, "b gets two by handoff")

	// The producer appends inside its own span.
	ptp := exporter(t, svcP)
	store, err := eventsource.New(pgtest.NewPool(t, 2), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	pctx, span := ptp.Tracer("producer").Start(ctx, "place-order")
	res, err := store.Append(pctx, "order-"+run, eventsource.Any, []eventsource.EventData{{Type: "Placed", Data: []byte(`{}`)}})
	require.NoError(t, err)
	span.End()
	appendTrace, appendSpan := span.SpanContext().TraceID().String(), span.SpanContext().SpanID().String()
	select {
	case <-handled:
	case <-ctx.Done():
		t.Fatal("the event was not handled")
	}

	// Failover: a stops dead (no graceful release); b steals on expiry.
	require.NoError(t, a.tp.ForceFlush(ctx))
	a.group.Abort()
	pgtest.Eventually(t, time.Minute, func() bool { return b.owned(t) == 4 }, "b takes a's buckets after their ttl")
	require.NoError(t, b.tp.ForceFlush(ctx))
	require.NoError(t, ptp.ForceFlush(ctx))

	hasOwnership := func(s jaegertest.Span) bool {
		return s.HasTag(obsname.AttrBucket) && s.HasTag(obsname.AttrWorker) && s.HasTag(obsname.AttrEpoch)
	}
	spansB, err := jaegertest.WaitForSpans(ctx, base, svcB, func(spans []jaegertest.Span) bool {
		return len(jaegertest.Filter(spans, jaegertest.Operation(obsname.SpanLeaseHandoffTake), hasOwnership)) > 0 &&
			len(jaegertest.Filter(spans, jaegertest.Operation(obsname.SpanLeaseSteal), hasOwnership)) > 0
	}, jaegertest.Lookback(time.Hour), jaegertest.WithClient(client))
	require.NoError(t, err, "b's handoff.take and steal spans reach Jaeger")
	steal := jaegertest.Filter(spansB, jaegertest.Operation(obsname.SpanLeaseSteal))[0]
	require.Equal(t, "lease_expired", steal.Tag(obsname.AttrEvidence))
	require.Equal(t, "a-"+run, steal.Tag(obsname.AttrPeer))

	_, err = jaegertest.WaitForSpans(ctx, base, svcA, func(spans []jaegertest.Span) bool {
		return len(jaegertest.Filter(spans, jaegertest.Operation(obsname.SpanLeaseHandoffGive), hasOwnership)) > 0 &&
			len(jaegertest.Filter(spans, jaegertest.Operation(obsname.SpanLeaseClaim), hasOwnership)) > 0
	}, jaegertest.Lookback(time.Hour), jaegertest.WithClient(client))
	require.NoError(t, err, "a's claim and handoff.give spans reach Jaeger")

	// The delivery span (from a or b) is in the producer's trace.
	var deliver jaegertest.Span
	for _, svc := range []string{svcA, svcB} {
		spans, err := jaegertest.QuerySpans(ctx, base, svc, jaegertest.WithOperation(obsname.SpanDeliver), jaegertest.Lookback(time.Hour), jaegertest.WithClient(client))
		require.NoError(t, err)
		for _, s := range jaegertest.Filter(spans, jaegertest.Tagged(obsname.AttrMessagingMessageID, res.IDs[0].String())) {
			deliver = s
		}
	}
	require.Equal(t, appendTrace, deliver.TraceID, "the delivery joined the producer's trace: %+v", deliver)
	require.Equal(t, appendSpan, deliver.ParentSpanID)
	fmt.Printf("jaeger: %s handoff.take, steal (evidence %s), delivery in trace %s\n", svcB, steal.Tag(obsname.AttrEvidence), deliver.TraceID)
	ctxStop, cancelStop := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelStop()
	require.NoError(t, b.rt.Stop(ctxStop))
	require.NoError(t, a.rt.Stop(ctxStop))
}
