// Package e2e holds end-to-end tests against real external systems, built
// with a tag each so that `make test` needs nothing but PostgreSQL:
//
//   - jaeger: two workers and a producer export their traces over OTLP to a
//     real Jaeger, a handoff and a failover are forced, and the ownership
//     spans and a delivery joined to its appender's trace are read back
//     from Jaeger's query API. Run it with `make test-jaeger`.
package e2e
