// Package observability is kumi's instrumentation: OpenTelemetry traces and
// metrics, a Prometheus/health/status HTTP endpoint, and slog plumbing for
// protoactor-go.
//
// It is middleware around the runtime, not woven through it (the
// otelriver approach): the actor runtime calls a handful of hooks on a
// [Telemetry] at the points where something observable happens, and the
// hooks turn them into spans, metrics and the few log lines worth an
// operator's attention.
//
//   - Ownership changes ([Telemetry.OwnershipChange]): one short span per
//     claim, renew failure, shed, handoff (both sides), steal, release and
//     lost fence, with subscription, bucket, worker and epoch, nested in the
//     coordinator's reconcile-pass span ([Telemetry.StartReconcile]).
//   - Deliveries ([Telemetry.StartDelivery]): one span per delivery, a child
//     of the trace that appended the event (its W3C trace context travels
//     in event metadata and is restored with eventsource.TraceContext).
//   - Reads ([Telemetry.StartPublisherFetch], [Telemetry.StartReaderFetch]),
//     overflows ([Telemetry.Overflow]), supervision decisions
//     ([Telemetry.SupervisionDecision]), notifier reconnects and lease
//     operations.
//   - Gauges — buckets owned, lag in events and seconds, queue depth — read
//     from snapshots each coordinator registers ([Telemetry.RegisterStatus]),
//     which also feed the /status page.
//
// Every name is under the prefix "kumi." (plus the OpenTelemetry
// "messaging.*" conventions); docs/observability.md lists them all, as the
// strings a dashboard or alert uses (kumi's own code spells them with the
// constants of internal/obsname). Metrics carry only low-cardinality attributes (subscription,
// bucket, outcome, …); ids go on spans.
//
// Configuration is OpenTelemetry's own: [Setup] reads the standard
// environment (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, …), exports
// traces with OTLP when an endpoint is set and metrics to Prometheus, and
// installs the result as otel's globals, which [New] uses by default. With
// nothing configured every hook is a no-op span plus no-op metric calls.
//
// [Handler] serves /metrics, /healthz and /status; [Serve] runs it.
// [ProtoactorLoggerFactory] routes protoactor-go's logging through slog with
// its Info chatter (every dead letter, every recovery) demoted to Debug.
package observability
