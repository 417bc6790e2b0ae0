package integration

import (
	"os"
	"time"
)

// The short form (CI, the default) runs every scenario for seconds; the
// long form (KUMI_CHAOS=long, `make chaos`) for about a minute each. The
// switch changes durations and counts, never which scenarios run.
var long = os.Getenv("KUMI_CHAOS") == "long"

// pick returns short in the short form and long in the long form.
func pick[T any](short, longForm T) T {
	if long {
		return longForm
	}
	return short
}

// form names the form in summary lines.
func form() string { return pick("short", "long") }

// leaseTimings are the lease settings the worker processes run with: short
// enough that a scenario sees several ttls, with heartbeat + margin < ttl
// and 3·heartbeat + margin ≤ ttl (one failed renewal is ridden out).
type leaseTimings struct {
	TTL, Heartbeat, Margin time.Duration
}

// defaultLease is 3 s / 300 ms / 1 s in both forms. A pass must finish
// within TTL − Margin (2 s) to renew; under -race on a 2-core machine that
// also runs other packages' tests, a 1.5 s ttl (1 s to renew) lost leases
// to scheduling alone and made the load, not kumi, the thing under test.
func defaultLease() leaseTimings {
	return leaseTimings{TTL: 3 * time.Second, Heartbeat: 300 * time.Millisecond, Margin: time.Second}
}
