package integration

import (
	"testing"

	"github.com/kumi-run/kumi/leasestore"
)

// TestManySessionSubscriptionsOnADefaultServer: the scenario of
// TestManySubscriptionsOnADefaultServer — 4 worker processes × 50
// subscriptions of 16 buckets on a server started with max_connections
// 100, a burst of appends, every event delivered once per subscription, no
// worker refused a connection — with session-kind leases. Each worker
// holds its 50 session locks, one per (subscription, worker), on one
// shared session connection (leasestore.Sessions, issue 27): before, each
// group had a session connection of its own, 4 × 50 more than the server
// allows.
func TestManySessionSubscriptionsOnADefaultServer(t *testing.T) {
	manySubscriptions(t, leasestore.KindSession)
}
