package actors

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// TestAFailoverStartsTheReadSideAgain: a worker on a multi-host URL
// (target_session_attrs=read-write) over a primary and a real streaming
// standby. 10 events reach the standby; it is cut off, and 40 more are
// delivered and checkpointed on the primary only. The primary dies, the
// standby is promoted with a head of 10, and 80 new events get positions
// 11 to 90 — 11 to 50 again. The worker finds the new timeline, its
// publisher starts from the new head and its readers from their
// checkpoints on the new primary: every event the new primary has is
// delivered, those at the reused positions too, and no checkpoint is
// above its head. Again with the worker's heavy reads on the standby
// (RuntimeOptions.ReadPool): cut off, it falls behind, and promoted it is
// the primary the read pool then reads.
func TestAFailoverStartsTheReadSideAgain(t *testing.T) {
	t.Run("ReadsOnThePrimary", func(t *testing.T) { failoverReadSide(t, false) })
	t.Run("ReadsOnTheStandby", func(t *testing.T) { failoverReadSide(t, true) })
}

func failoverReadSide(t *testing.T, readPool bool) {
	ctx := context.Background()
	start, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(start, pgtest.Options{MaxConnections: 100})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	standby := pgtest.NewReplica(t, srv)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		srv.Port(), standby.Port())
	const schema, sub, buckets = "kumi", "failover", 2
	direct, err := eventsource.New(pgtest.PoolOn(t, url, 4), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, Migrate(ctx, direct))
	require.NoError(t, direct.EnsureConsumerGroupIndex(ctx, buckets))

	rec := newRecorder()
	var ro RuntimeOptions
	if readPool {
		ro.ReadPool = pgtest.PoolOn(t, standby.URL, 8)
		ro.ReadReplica = eventsource.ReadReplicaOptions{Wait: 500 * time.Millisecond}
	}
	w := startWorkerWith(t, pgtest.PoolOn(t, url, 12), schema, "a", ro, groupOpts(sub, buckets, rec, "a"))
	appendStreams := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			_, err := direct.Append(ctx, fmt.Sprintf("acct-%s%d", prefix, i%7), eventsource.Any,
				[]eventsource.EventData{{Type: "Seeded", Data: fmt.Appendf(nil, `{"i":%d}`, i)}})
			require.NoError(t, err)
		}
	}
	checkpointsAt := func(want int64) func() bool {
		return func() bool {
			cps, err := direct.Checkpoints(ctx, sub)
			if err != nil || len(cps) < buckets {
				return false
			}
			var top int64
			for _, c := range cps {
				top = max(top, c.Position)
			}
			return top == want
		}
	}
	appendStreams("old", 10)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 10 }, "10 delivered (got %d)", observed(rec.distinct))
	pgtest.Eventually(t, waitLong, checkpointsAt(10), "checkpointed through 10")
	require.NoError(t, standby.WaitReplayed(ctx))
	require.NoError(t, standby.Detach(ctx))

	appendStreams("lost", 40) // delivered on the old primary only
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 50 }, "50 delivered (got %d)", observed(rec.distinct))
	pgtest.Eventually(t, waitLong, checkpointsAt(50), "checkpointed through 50 on the old primary")
	before := w.rt.Store().Server()

	srv.Stop()
	require.NoError(t, standby.Promote(ctx))
	promoted := time.Now()
	direct.Pool().Reset()
	h, err := direct.HeadPosition(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 10, h, "the promoted standby's head is what it had replayed")
	appendStreams("first", 1) // position 11, once sequenced
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 51 }, "the first event appended after the promotion is delivered")
	t.Logf("the first event appended after the promotion was delivered %v after it", time.Since(promoted).Round(time.Millisecond))
	appendStreams("new", 79) // positions 12 to 90

	var missing []int64
	pgtest.Eventually(t, waitLong, func() bool {
		missing = undelivered(t, direct, rec)
		return len(missing) == 0 && headOf(t, direct) == 90
	}, "every event of the new primary delivered (head %d; not delivered at %v)", observed(func() int64 { return headOf(t, direct) }),
		observed(func() []int64 { return missing }))
	pgtest.Eventually(t, waitLong, checkpointsAt(90), "checkpointed through 90 on the new primary")

	after := w.rt.Store().Server()
	require.Equal(t, before.Epoch+1, after.Epoch, "one server change found")
	require.Equal(t, eventsource.ServerChangeTimeline, after.Last.Reason)
	require.Equal(t, before.Identity.System, after.Identity.System)
	require.Equal(t, before.Identity.Timeline+1, after.Identity.Timeline)
	require.EqualValues(t, 1, after.Epoch, "the metric kumi.store.server_changes counts it")
	require.Equal(t, after.Epoch, w.rt.publishedEpoch.Load(), "the publisher is in the new epoch")
}

// startWorkerWith is startWorkerOn with runtime options of the test's
// (a read pool, say).
func startWorkerWith(t *testing.T, pool *pgxpool.Pool, schema, name string, ro RuntimeOptions, opts GroupOptions) *testWorker {
	t.Helper()
	ctx := context.Background()
	w := &testWorker{name: name, sys: quietSystem(), pool: pool}
	store, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	ro.Logger, ro.PollInterval = testLogger(), 200*time.Millisecond
	w.rt, err = startedRuntime(ctx, w.sys, store, ro)
	require.NoError(t, err)
	opts.Worker = name
	w.group, err = w.rt.StartGroup(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	return w
}

// undelivered returns the positions of the store's events that rec has
// not seen delivered.
func undelivered(t *testing.T, s *eventsource.Store, rec *recorder) []int64 {
	t.Helper()
	var missing []int64
	var after int64
	for {
		events, err := s.ReadAll(context.Background(), after, 500)
		if err != nil {
			return []int64{-1} // the new primary is not up yet
		}
		if len(events) == 0 {
			return missing
		}
		rec.mu.Lock()
		for _, e := range events {
			if rec.count[uuid.UUID(e.ID)] == 0 {
				missing = append(missing, e.Position)
			}
		}
		rec.mu.Unlock()
		after = events[len(events)-1].Position
	}
}

func headOf(t *testing.T, s *eventsource.Store) int64 {
	t.Helper()
	h, err := s.HeadPosition(context.Background())
	if err != nil {
		return -1
	}
	return h
}
