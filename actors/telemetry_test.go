package actors

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
)

func startTracedWorker(t *testing.T, schema, name string, o GroupOptions, tel *observability.Telemetry) *testWorker {
	t.Helper()
	ctx := context.Background()
	w := &testWorker{name: name, sys: quietSystem(), pool: pgtest.NewPool(t, 8)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), Telemetry: tel})
	require.NoError(t, err)
	o.Worker = name
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	return w
}

func spansNamed(exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// Every ownership change is a span, with subscription, bucket, worker and
// epoch, under the reconcile pass that made it; a delivery's span joins the
// trace that appended the event.
func TestOwnershipChangesAndDeliveriesAreTraced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })
	tel := observability.New(observability.Options{TracerProvider: tp, Logger: testLoggerOrDiscard()})
	rec := newRecorder()

	a := startTracedWorker(t, schema, "a", groupOpts("traced", 4, rec, "a"), tel)
	pgtest.Eventually(t, waitLong, func() bool { return len(a.owned()) == 4 }, "a claims all")
	b := startTracedWorker(t, schema, "b", groupOpts("traced", 4, rec, "b"), tel)
	pgtest.Eventually(t, waitLong, func() bool { return fairSplit(4, a, b) }, "handoff to b: %v", owners(a, b))

	// An append inside a span: its delivery joins that trace.
	appendCtx, appendSpan := tp.Tracer("test").Start(ctx, "append")
	res, err := store.Append(appendCtx, "acct-1", eventsource.Any, []eventsource.EventData{{Type: "Traced", Data: []byte(`{}`)}})
	require.NoError(t, err)
	appendSpan.End()
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 1 }, "the event is handled")

	a.kill(t) // b steals a's buckets once its leases expire
	pgtest.Eventually(t, waitLong, func() bool { return len(b.owned()) == 4 }, "b takes over")
	b.stop(t) // and releases them all

	for _, kind := range []observability.ChangeKind{
		observability.ChangeClaim, observability.ChangeHandoffRequest, observability.ChangeShed,
		observability.ChangeHandoffGive, observability.ChangeHandoffTake, observability.ChangeSteal,
		observability.ChangeRelease,
	} {
		spans := spansNamed(exp, kind.SpanName())
		require.NotEmpty(t, spans, "a %s span", kind.SpanName())
		s := spans[0]
		require.Equal(t, "traced", attr(s, obsname.AttrSubscription).AsString(), kind)
		require.NotEmpty(t, attr(s, obsname.AttrWorker).AsString(), kind)
		require.True(t, attr(s, obsname.AttrBucket).Type() == attribute.INT64, "%s has a bucket", kind)
		if kind != observability.ChangeHandoffRequest {
			require.Positive(t, attr(s, obsname.AttrEpoch).AsInt64(), "%s has an epoch", kind)
		}
	}
	steal := spansNamed(exp, observability.ChangeSteal.SpanName())[0]
	require.Equal(t, "lease_expired", attr(steal, obsname.AttrEvidence).AsString())
	require.Equal(t, "a", attr(steal, obsname.AttrPeer).AsString())

	// Claims made by a pass are children of its kumi.reconcile span.
	claim := spansNamed(exp, observability.ChangeClaim.SpanName())[0]
	var parent string
	for _, s := range spansNamed(exp, obsname.SpanReconcile) {
		if s.SpanContext.SpanID() == claim.Parent.SpanID() {
			parent = s.Name
		}
	}
	require.Equal(t, obsname.SpanReconcile, parent)

	var joined bool
	for _, s := range spansNamed(exp, obsname.SpanDeliver) {
		if attr(s, obsname.AttrMessagingMessageID).AsString() == res.IDs[0].String() {
			joined = s.SpanContext.TraceID() == appendSpan.SpanContext().TraceID() &&
				s.Parent.SpanID() == appendSpan.SpanContext().SpanID()
		}
	}
	require.True(t, joined, "the delivery span is a child of the append span")
}
