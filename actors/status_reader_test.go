package actors

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
)

// The status carries each reader's own account of where it stands. With
// its handler stuck on the bucket's first event, the reader says so: that
// event in flight, the others read and pending, its cursor at the last of
// them and nothing acked. Once the handler lets go, it reports every event
// handled. Both the Go status and observability's /status page say it,
// and the page gives the publisher's position beside it.
func TestTheStatusSaysWhereEachReaderStands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	seed(t, store, "acct", 1, 5) // one stream, one bucket: one event at a time
	last := lastPosition(t, store, "acct")
	started, release := make(chan struct{}), make(chan struct{})
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	opts := GroupOptions{Subscription: "status", Category: "acct", Buckets: 1, Lease: fastLease(),
		Handler: blockingHandler(started, release), CheckpointInterval: 20 * time.Millisecond,
		HandlerTimeout: 10 * time.Minute} // the stuck handler is never replaced meanwhile
	w := startWorker(t, schema, "w", opts)
	select {
	case <-started:
	case <-time.After(waitLong):
		t.Fatal("the handler got no delivery")
	}

	reader := func() *observability.ReaderStatus {
		st, err := w.group.Status(ctx)
		require.NoError(t, err)
		if len(st.Owned) != 1 {
			return nil
		}
		return st.Owned[0].Reader
	}
	var got *observability.ReaderStatus
	stuck := func(r *observability.ReaderStatus) bool {
		return r != nil && r.InFlight == 1 && r.Pending == 4 && r.Cursor == last && r.Acked == 0 && r.NextPending > 0 &&
			r.HandlerReady && !r.CatchingUp && !r.Draining && !r.Bounded
	}
	pgtest.Eventually(t, waitLong, func() bool { got = reader(); return stuck(got) },
		"the reader reports its first event in flight and four pending, read through %d: %+v", last, observed(func() any { return got }))
	page := w.group.g.statusSnapshot()
	require.Len(t, page.Owned, 1)
	require.NotNil(t, page.Owned[0].Reader, "/status carries the reader's report")
	require.True(t, stuck(page.Owned[0].Reader), "/status: %+v", page.Owned[0].Reader)
	require.Equal(t, last, page.Published, "/status: the publisher read through the events seeded before it started")

	close(release)
	released = true
	pgtest.Eventually(t, waitLong, func() bool {
		got = reader()
		return got != nil && got.Acked == last && got.Pending == 0 && got.InFlight == 0 && got.NextPending == 0
	}, "the reader reports every event handled through %d: %+v", last, observed(func() any { return got }))
}

// A reader that stops takes its report with it: while its bucket has no
// reader (here its coordinator is kept busy, so that none is spawned
// again), the status says so (Reader nil), not what the stopped reader
// last reported. The next reader reports anew.
func TestAStoppedReaderLeavesNoReportBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	w := startWorker(t, schema, "w", groupOpts("status-gone", 1, newRecorder(), "w"))
	reader := func() (*observability.ReaderStatus, bool) {
		st, err := w.group.Status(ctx)
		require.NoError(t, err)
		if len(st.Owned) != 1 {
			return nil, false
		}
		return st.Owned[0].Reader, true
	}
	reported := func() bool { r, owned := reader(); return owned && r != nil }
	pgtest.Eventually(t, waitLong, reported, "the bucket's reader reports%s", observed(w.diagnose))
	pid := w.readerOf(t, 0)

	busy, gate := make(chan struct{}), make(chan struct{})
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open)
	w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(*coordinator) {
		close(busy)
		<-gate // no pass, no reader spawned meanwhile
	}))
	<-busy
	require.NoError(t, stopActor(ctx, w.sys, pid))
	r, owned := reader()
	require.True(t, owned, "the bucket is still owned (its coordinator is busy)")
	require.Nil(t, r, "the status still carries the stopped reader's report")

	open()
	pgtest.Eventually(t, waitLong, reported, "the next reader reports%s", observed(w.diagnose))
}
