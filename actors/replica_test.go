package actors

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/internal/readfeed"
	"github.com/kumi-run/kumi/kumierr"
)

// startReplicaWorker is startWorker on srv's URL, reading on the hot
// standby at readURL (RuntimeOptions.ReadPool).
func startReplicaWorker(t *testing.T, srv *pgtest.Server, readURL, schema, name string, ro eventsource.ReadReplicaOptions, opts GroupOptions) *testWorker {
	t.Helper()
	ctx := context.Background()
	w := &testWorker{name: name, sys: quietSystem(), pool: pgtest.PoolOn(t, srv.URL, 12)}
	store, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, store, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond,
		ReadPool: pgtest.PoolOn(t, readURL, 8), ReadReplica: ro})
	require.NoError(t, err)
	opts.Worker = name
	w.group, err = w.rt.StartGroup(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	return w
}

func TestReadPoolOptionsAreValidated(t *testing.T) {
	store, _ := newTestStore(t)
	_, err := startedRuntime(context.Background(), quietSystem(), store, RuntimeOptions{ReadPool: store.Pool(),
		ReadReplica: eventsource.ReadReplicaOptions{Wait: -time.Second}})
	var oe *kumierr.ConfigError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "actors.RuntimeOptions.ReadReplica.Wait", oe.Field)
}

// TestGroupReadsOnAReplica: two workers whose catch-up pages and publisher
// reads go to a real hot standby handle every event exactly once, in order
// per stream, through a catch-up, live appends with replay paused (reads
// past Wait go to the primary), and a restart of the standby; the reads
// went to the standby, and to the primary only while it could not serve
// them.
func TestGroupReadsOnAReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, schema, direct := migratedOnAServer(t)
	require.NoError(t, direct.EnsureConsumerGroupIndex(ctx, 4))
	seed(t, direct, "acct", 20, 200) // a backlog to catch up from the standby
	r := pgtest.NewReplica(t, srv)
	rec := newRecorder()
	ro := eventsource.ReadReplicaOptions{Wait: 300 * time.Millisecond, LagInterval: 20 * time.Millisecond}
	a := startReplicaWorker(t, srv, r.URL, schema, "a", ro, groupOpts("replica", 4, rec, "a"))
	b := startReplicaWorker(t, srv, r.URL, schema, "b", ro, groupOpts("replica", 4, rec, "b"))
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 200 }, "the backlog is handled (got %d)", observed(rec.distinct))
	onStandby := a.rt.ReadReplica().Stats().StandbyReads + b.rt.ReadReplica().Stats().StandbyReads
	require.Positive(t, onStandby, "the catch-up read the standby")

	seed(t, direct, "acct", 20, 100) // live
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 300 }, "live events are handled (got %d)", observed(rec.distinct))

	require.NoError(t, r.PauseReplay(ctx))
	seed(t, direct, "acct", 20, 100)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 400 },
		"events the paused standby does not show are read on the primary (got %d)", observed(rec.distinct))
	require.Positive(t, a.rt.ReadReplica().Stats().PrimaryReads+b.rt.ReadReplica().Stats().PrimaryReads)
	require.NoError(t, r.ResumeReplay(ctx))

	require.NoError(t, r.Restart(ctx))
	seed(t, direct, "acct", 20, 100)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 500 }, "through the restart (got %d)", observed(rec.distinct))
	require.NoError(t, r.WaitReplayed(ctx))
	before := a.rt.ReadReplica().Stats().StandbyReads + b.rt.ReadReplica().Stats().StandbyReads
	seed(t, direct, "acct", 20, 100)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 600 }, "after the restart (got %d)", observed(rec.distinct))
	pgtest.Eventually(t, waitLong, func() bool {
		return a.rt.ReadReplica().Stats().StandbyReads+b.rt.ReadReplica().Stats().StandbyReads > before
	}, "reads are back on the standby")

	require.Zero(t, rec.duplicates(), "each event handled once")
	require.Empty(t, rec.order, "per-stream order")
	require.Empty(t, rec.overlaps)
}

// TestAReaderOnAStandbyCoversWhatThePublisherRead: a reader whose
// catch-up reads a standby covers the publisher's position, not only the
// batches it got. The publisher, reading past a paused standby on the
// primary (after Wait) for another group, is ahead of the standby when the
// group starts: its reader gets no batch for the events before its
// subscription, and a catch-up trusted up to the batches alone would end
// on the standby's head and wait for a batch that never comes.
func TestAReaderOnAStandbyCoversWhatThePublisherRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, schema, direct := migratedOnAServer(t)
	r := pgtest.NewReplica(t, srv)
	other, late := newRecorder(), newRecorder()
	ro := eventsource.ReadReplicaOptions{Wait: 20 * time.Millisecond}
	w := startReplicaWorker(t, srv, r.URL, schema, "w", ro, GroupOptions{Subscription: "other", Category: "other", Buckets: 2,
		Handler: ackHandler(other, "w"), Lease: fastLease(), CheckpointInterval: 20 * time.Millisecond})

	require.NoError(t, r.PauseReplay(ctx))
	t.Cleanup(func() { _ = r.ResumeReplay(context.Background()) })
	seed(t, direct, "acct", 5, 10)
	pgtest.Eventually(t, waitLong, func() bool {
		pos, err := w.sys.Root.RequestFuture(w.rt.publisher, &publisherPosition{}, time.Second).Result()
		return err == nil && pos.(int64) >= 10 // sequenced by the worker's sequencer
	}, "the publisher read the new events on the primary")

	g, err := w.rt.StartGroup(ctx, GroupOptions{Subscription: "late", Category: "acct", Buckets: 2, Worker: "w",
		Handler: ackHandler(late, "w"), Lease: fastLease(), CheckpointInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return late.distinct() == 10 },
		"the late group handles the events before it, the standby still paused (got %d)", observed(late.distinct))
	require.NoError(t, r.ResumeReplay(ctx))
	require.NoError(t, g.Stop(ctx))
}

// TestAReaderOnAStandbyCoversWhereItsSubscriptionStarts: the publisher
// registers a reader at its position when it takes the subscribe, which
// may be after a fetch it had read but not yet taken: the batch of that
// fetch does not go to the reader. The reader's catch-up, reading a
// standby up to the position the publisher had taken when the page was
// read, then ends below an event that fetch read on the primary (past the
// lagging standby), and no batch brings it: at the tail of the stream,
// with no later event of its bucket, the reader waited for ever. It
// catches up through the position its subscription starts at.
func TestAReaderOnAStandbyCoversWhereItsSubscriptionStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, schema, direct := migratedOnAServer(t)
	r := pgtest.NewReplica(t, srv)
	other, late := newRecorder(), newRecorder()
	w := startReplicaWorker(t, srv, r.URL, schema, "w", eventsource.ReadReplicaOptions{Wait: 20 * time.Millisecond},
		GroupOptions{Subscription: "other", Category: "other", Buckets: 1, Handler: ackHandler(other, "w"), Lease: fastLease(),
			CheckpointInterval: 20 * time.Millisecond})
	seed(t, direct, "acct", 5, 10)
	publisherAt := func() int64 {
		pos, err := w.sys.Root.RequestFuture(w.rt.publisher, &publisherPosition{}, time.Second).Result()
		if err != nil {
			return -1
		}
		return pos.(int64)
	}
	pgtest.Eventually(t, waitLong, func() bool { return publisherAt() == 10 }, "the publisher reads the 10 events (at %d)",
		observed(publisherAt))
	require.NoError(t, r.WaitReplayed(ctx))
	require.NoError(t, r.PauseReplay(ctx)) // the standby shows the 10 events, and no later one
	t.Cleanup(func() { _ = r.ResumeReplay(context.Background()) })

	// The publisher is held, between fetches.
	through, queued, release := make(chan int64, 1), make(chan *publisherFetched, 1), make(chan struct{})
	unhold := sync.OnceFunc(func() { close(release) })
	defer unhold()
	pgtest.Eventually(t, waitLong, func() bool {
		idle := make(chan bool, 1)
		w.sys.Root.Send(w.rt.publisher, inspectPublisher(func(p *publisher, c actor.Context) {
			idle <- !p.fetching
			if p.fetching {
				return
			}
			select {
			case known := <-through:
				// The fetch of the new event, read as a wake-up reads it
				// (on the primary: the standby lags), taken after
				// everything before the hold was taken and before the
				// subscribe sent during it.
				p.fetching = true
				f := p.read(context.Background(), p.pos, known, false, publisherBatchSize, len(p.subs))
				c.Send(c.Self(), f)
				queued <- f
			case <-release:
				return
			}
			<-release
		}))
		return <-idle
	}, "the publisher is held between fetches")

	_, err := direct.Append(ctx, "acct-x", eventsource.Any, []eventsource.EventData{{Type: "Tail", Data: []byte(`{}`)}})
	require.NoError(t, err)
	var head int64
	pgtest.Eventually(t, waitLong, func() bool {
		head, err = direct.HeadPosition(ctx)
		require.NoError(t, err)
		return head == 11
	}, "the new event is sequenced (head %d)", observed(func() int64 { return head }))
	through <- head
	select {
	case f := <-queued:
		require.NoError(t, f.err)
		require.Equal(t, head, f.to, "the held publisher's fetch read the new event")
	case <-time.After(waitLong):
		t.Fatal("the held publisher did not fetch")
	}

	// A group starts on the events: its reader subscribes behind that
	// fetch, and catches up on the standby while the publisher is held.
	g, err := w.rt.StartGroup(ctx, GroupOptions{Subscription: "late", Category: "acct", Buckets: 1, Worker: "w",
		Handler: ackHandler(late, "w"), Lease: fastLease(), CheckpointInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	lw := &testWorker{name: "w", sys: w.sys, pool: w.pool, rt: w.rt, group: g}
	pid := lw.readerOf(t, 0)
	var caughtUp bool
	var state string
	pgtest.Eventually(t, waitLong, func() bool {
		lw.onReader(t, pid, func(r *reader) {
			caughtUp, state = r.feed.Phase() == readfeed.Live && r.feed.Cursor() == 10, r.describe()
		})
		return caughtUp && late.distinct() == 10
	}, "the reader caught up through the 10 events on the standby (%d handled; %s)", observed(late.distinct),
		observed(func() string { return state }))
	unhold()

	pgtest.Eventually(t, waitLong, func() bool { return late.distinct() == 11 },
		"the event the held fetch read is handled with no later append (got %d)%s", observed(late.distinct), observed(lw.diagnose))
	require.NoError(t, g.Stop(ctx))
}

// migratedOnAServer is a new schema, migrated, on a server of the test's
// own (one a standby can follow), and a store on it.
func migratedOnAServer(t *testing.T) (*pgtest.Server, string, *eventsource.Store) {
	t.Helper()
	srv := pgtest.LocalServer(t)
	schema := pgtest.NewSchema(t)
	direct, err := eventsource.New(pgtest.PoolOn(t, srv.URL, 4), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, Migrate(context.Background(), direct))
	return srv, schema, direct
}
