package otelsetup_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/observability/otelsetup"
)

// A process configures OpenTelemetry from the environment once, at start,
// and serves /metrics, /healthz and /status.
func ExampleSetup() {
	ctx := context.Background()
	// OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 exports traces
	// (to Jaeger, say); unset, tracing stays a no-op.
	shutdown, err := otelsetup.Setup(ctx, otelsetup.Options{ServiceName: "orders-projector"})
	if err != nil {
		log.Fatal(err)
	}
	defer shutdown(ctx)

	// nil providers: the globals Setup just installed.
	tel := observability.New(observability.Options{})
	defer tel.Close()
	// … hand tel to the runtime, and serve its status:
	_ = observability.Handler(observability.HandlerOptions{Telemetry: tel})
	fmt.Println("configured")
	// Output: configured
}
