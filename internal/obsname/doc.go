// Package obsname holds every name kumi's instrumentation emits: span and
// span-event names, attribute keys and values, metric names and units,
// under the prefix "kumi." (plus the OpenTelemetry "messaging.*"
// conventions). They are strings for dashboards and alerts, listed in
// docs/observability.md (a test in package observability keeps the two in
// step); the constants are internal so that kumi's own packages and tests
// share one spelling without making each a public identifier.
package obsname
