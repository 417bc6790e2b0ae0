package actors

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
)

const waitLong = 60 * time.Second

// fastLease is the tests' lease timing: a row lease's failover in about
// five seconds. A pass is abandoned after one heartbeat, and under the race
// detector with every package's tests sharing two cores a pass takes
// hundreds of milliseconds: with a 150 ms heartbeat every pass was
// abandoned and the worker delivered nothing (see
// TestTheTestsLeaseTimingsTolerateSlowPasses). 3·heartbeat + margin ≤ TTL:
// one lost renewal stops no reader.
func fastLease() leasestore.LeaseOptions {
	return leasestore.LeaseOptions{TTL: 4 * time.Second, Heartbeat: time.Second, Margin: time.Second}
}

func groupOpts(sub string, n int, rec *recorder, worker string) GroupOptions {
	return GroupOptions{
		Subscription: sub, Category: "acct", Buckets: n,
		Handler: ackHandler(rec, worker), Lease: fastLease(),
		CheckpointInterval: 20 * time.Millisecond,
	}
}

// ownedBy returns each worker's owned buckets, sorted.
func ownedBy(ws ...*testWorker) map[string][]int {
	out := map[string][]int{}
	for _, w := range ws {
		b := w.owned()
		sort.Ints(b)
		out[w.name] = b
	}
	return out
}

func fairSplit(n int, ws ...*testWorker) bool {
	share := (n + len(ws) - 1) / len(ws)
	seen := map[int]bool{}
	for _, w := range ws {
		o := w.owned()
		if len(o) > share {
			return false
		}
		for _, b := range o {
			if seen[b] {
				return false
			}
			seen[b] = true
		}
	}
	return len(seen) == n
}

func TestGroup(t *testing.T) {
	t.Parallel()

	t.Run("OneWorkerDrainsASeededCategoryExactlyOnce", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 25, 500)
		rec := newRecorder()
		w := startWorker(t, schema, "w1", groupOpts("drain", 4, rec, "w1"))
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 500 }, "all 500 events handled (got %d)", observed(rec.distinct))
		require.Zero(t, rec.duplicates())
		require.Empty(t, rec.order)
		require.Empty(t, rec.overlaps)
		require.ElementsMatch(t, []int{0, 1, 2, 3}, w.owned())
		w.stop(t)
		cps, err := store.Checkpoints(context.Background(), "drain")
		require.NoError(t, err)
		require.Len(t, cps, 4, "every bucket has a checkpoint after a graceful stop")
	})

	t.Run("ThreeWorkersSplitFairlyAndSurviveAHardKill", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 30, 300)
		rec := newRecorder()
		ws := []*testWorker{
			startWorker(t, schema, "a", groupOpts("three", 6, rec, "a")),
			startWorker(t, schema, "b", groupOpts("three", 6, rec, "b")),
			startWorker(t, schema, "c", groupOpts("three", 6, rec, "c")),
		}
		pgtest.Eventually(t, waitLong, func() bool { return fairSplit(6, ws...) }, "fair split of 6 over 3: %v", owners(ws...))
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 300 }, "first 300 handled (got %d)", observed(rec.distinct))
		ws[0].kill(t)
		seed(t, store, "acct", 30, 300)
		pgtest.Eventually(t, waitLong, func() bool { return fairSplit(6, ws[1:]...) }, "survivors take the dead worker's buckets: %v", owners(ws[1:]...))
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 600 }, "all 600 handled (got %d)", observed(rec.distinct))
		require.Empty(t, rec.overlaps, "no stream handled by two workers at once")
		require.Empty(t, rec.order, "per-stream order")
	})

	t.Run("GracefulStopReleasesEveryLeaseAtOnce", func(t *testing.T) {
		t.Parallel()
		_, schema := newTestStore(t)
		rec := newRecorder()
		slow := leasestore.LeaseOptions{TTL: 5 * time.Minute, Heartbeat: time.Second, Margin: time.Minute}
		oa, ob := groupOpts("graceful", 4, rec, "a"), groupOpts("graceful", 4, rec, "b")
		oa.Lease, ob.Lease = slow, slow
		a := startWorker(t, schema, "a", oa)
		b := startWorker(t, schema, "b", ob)
		pgtest.Eventually(t, waitLong, func() bool { return fairSplit(4, a, b) }, "fair split: %v", owners(a, b))
		a.stop(t)
		// The ttl is five minutes: only an immediate release explains this.
		pgtest.Eventually(t, waitLong, func() bool { return len(b.owned()) == 4 }, "b owns all four: %v", owners(b))
	})

	t.Run("AHandoffMidDrainLosesAndDuplicatesNothing", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		seed(t, store, "acct", 40, 2000)
		rec := newRecorder()
		a := startWorker(t, schema, "a", groupOpts("handoff", 4, rec, "a"))
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() > 100 }, "a started draining")
		b := startWorker(t, schema, "b", groupOpts("handoff", 4, rec, "b"))
		pgtest.Eventually(t, waitLong, func() bool { return fairSplit(4, a, b) }, "b got its share by handoff: %v", owners(a, b))
		pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 2000 }, "all handled (got %d)", observed(rec.distinct))
		require.Zero(t, rec.duplicates(), "a cooperative handoff delivers nothing twice")
		require.Empty(t, rec.overlaps)
		require.Empty(t, rec.order)
	})
}

func TestOptionsAreValidatedNamingTheField(t *testing.T) {
	t.Parallel()
	base := GroupOptions{Subscription: "s", Category: "c", Buckets: 4, Handler: ackHandler(newRecorder(), "w")}
	cases := map[string]func(o *GroupOptions){
		"Subscription":             func(o *GroupOptions) { o.Subscription = "" },
		"Category":                 func(o *GroupOptions) { o.Category = "a-b" },
		"Buckets":                  func(o *GroupOptions) { o.Buckets = -1 },
		"Handler":                  func(o *GroupOptions) { o.Handler = nil },
		"BatchSize":                func(o *GroupOptions) { o.BatchSize = -5 },
		"QueueCapacity":            func(o *GroupOptions) { o.QueueCapacity = -1 },
		"QueueBytes":               func(o *GroupOptions) { o.QueueBytes = 1000 },
		"Retry.MaxAttempts":        func(o *GroupOptions) { o.Retry.MaxAttempts = -1 },
		"HandlerTimeout":           func(o *GroupOptions) { o.HandlerTimeout = -time.Second },
		"MaxInFlight":              func(o *GroupOptions) { o.MaxInFlight = 5000 },
		"OnDeadLetter":             func(o *GroupOptions) { o.OnDeadLetter = 9 },
		"CheckpointEvery":          func(o *GroupOptions) { o.CheckpointEvery = -1 },
		"CheckpointInterval":       func(o *GroupOptions) { o.CheckpointInterval = -time.Second },
		"DatabaseTimeout":          func(o *GroupOptions) { o.DatabaseTimeout = -time.Second },
		"Worker":                   func(o *GroupOptions) { o.Worker = "w\n" },
		"Lease.Kind":               func(o *GroupOptions) { o.Lease.Kind = 7 },
		"Lease.Heartbeat":          func(o *GroupOptions) { o.Lease.TTL, o.Lease.Heartbeat = time.Second, 2*time.Second },
		"Lease.TTL":                func(o *GroupOptions) { o.Lease.TTL = time.Nanosecond },
		"Lease.Margin":             func(o *GroupOptions) { o.Lease.Margin = -time.Second },
		"Retry.Backoff.Multiplier": func(o *GroupOptions) { o.Retry.Backoff.Multiplier = 0.5 },
		"Retry.Backoff.Initial":    func(o *GroupOptions) { o.Retry.Backoff.Initial = -time.Second },
	}
	for field, mutate := range cases {
		o := base
		mutate(&o)
		err := o.WithDefaults().Validate()
		var oe *kumierr.ConfigError
		require.ErrorAs(t, err, &oe, field)
		require.Equal(t, "actors.GroupOptions."+field, oe.Field)
		require.True(t, strings.HasPrefix(err.Error(), "kumi: invalid actors.GroupOptions."+field), err.Error())
	}
	require.NoError(t, base.WithDefaults().Validate())
}
