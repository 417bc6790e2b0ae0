// Package jaegertest queries a Jaeger query service's HTTP API
// (/api/traces, /api/services) and returns spans with their tags, so that kumi's
// own end-to-end tests can assert on what a kumi process exported:
//
//	spans, err := jaegertest.WaitForSpans(ctx, os.Getenv("KUMI_JAEGER_URL"), "kumi-e2e",
//		func(s []jaegertest.Span) bool {
//			return len(jaegertest.Filter(s, jaegertest.Operation("kumi.lease.handoff.take"))) > 0
//		}, jaegertest.Lookback(time.Hour))
//
// tools/jaeger/jaeger.sh starts a suitable Jaeger on loopback and prints
// KUMI_JAEGER_URL. The package has no dependency on the rest of kumi; it
// is internal, kumi's test machinery, not part of its public API.
package jaegertest
