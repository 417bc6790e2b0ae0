// Package otelsetup configures OpenTelemetry for a kumi process the
// standard way, from the OTEL_* environment variables: an OTLP span
// exporter (HTTP or gRPC), a Prometheus metrics exporter served by
// observability.Handler's /metrics, the resource and the W3C propagators,
// installed as otel's globals. It is kept apart from package
// observability so that embedding kumi (package actors) pulls in no
// exporter and no gRPC: a service that configures OpenTelemetry itself
// never imports this package.
package otelsetup
