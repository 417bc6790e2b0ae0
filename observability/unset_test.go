package observability

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestDeliveriesStartNoSpanUntilAProviderIsSet: with kumi's tracer from
// otel's global provider and none set yet, a delivery starts no span (its
// context is the one given, with the appender's span context, if any) but
// is still counted; once a provider is set, deliveries are traced through
// it. It runs in a process of its own: otel's global provider, once set by
// another test, cannot be unset.
func TestDeliveriesStartNoSpanUntilAProviderIsSet(t *testing.T) {
	if os.Getenv("KUMI_FRESH_OTEL") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDeliveriesStartNoSpanUntilAProviderIsSet$", "-test.count=1")
		cmd.Env = append(os.Environ(), "KUMI_FRESH_OTEL=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "PASS")
		return
	}
	require.True(t, isOtelDefault(otel.GetTracerProvider()), "nothing set a provider in this process")
	require.False(t, isOtelDefault(sdktrace.NewTracerProvider()))

	tel := New(Options{})
	defer tel.Close()
	parent := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true}))
	ctx, d := tel.StartDelivery(parent, DeliveryInfo{Subscription: "s", Bucket: 1})
	require.Equal(t, parent, ctx, "no span: the context is the one given")
	require.Equal(t, trace.SpanContextFromContext(parent), trace.SpanContextFromContext(ctx))
	d.End(OutcomeAck, nil)
	d.EndPanic("boom", nil)

	exp := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	ctx, d = tel.StartDelivery(parent, DeliveryInfo{Subscription: "s", Bucket: 1})
	require.True(t, trace.SpanFromContext(ctx).IsRecording(), "a provider set later gets the spans")
	d.End(OutcomeAck, nil)
	require.Len(t, exp.GetSpans(), 1)
	require.Equal(t, trace.TraceID{1}, exp.GetSpans()[0].SpanContext.TraceID(), "the delivery joins the appender's trace")
}
