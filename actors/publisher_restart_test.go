package actors

import (
	"context"
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// The publisher is one actor per process, and every reader's live events
// come from it. A panic in it made its supervisor restart it with no
// subscriber: every reader of the process then waited for batches that
// never came (a reader learns of a gap only from a later batch), and
// delivered nothing more. The subscribers now survive the restart, and
// each is told where its batches start again, so that it reads from the
// store what the failed incarnation may not have posted to it.
func TestAPublisherRestartLeavesEveryReaderDelivering(t *testing.T) {
	t.Parallel()
	store, rec, w := eightHandled(t, "publisher-restart")

	failed := make(chan struct{})
	w.sys.Root.Send(w.rt.publisher, inspectPublisher(func(*publisher, actor.Context) {
		close(failed)
		panic(errors.New("test: the publisher fails"))
	}))
	<-failed
	seed(t, store, "acct", 4, 8)
	w.requireSixteenHandledOnce(t, rec)
}

// A publisher that fails between publishing a position and posting the
// batches up to it — a broadcast cut short — restarts at that position:
// its new incarnation's batches start after events no reader was posted,
// and at the tail of the stream no later batch shows the gap. Its
// readers catch up through that position because it tells them where
// their batches start (subscribed); a restart that kept the subscribers
// but told them nothing left a bucket short of events, for ever. Here the
// publisher is held busy while 8 events are appended, publishes the head
// without posting anything, and fails.
func TestAPublisherThatFailsMidBroadcastLeavesNoReaderShort(t *testing.T) {
	t.Parallel()
	store, rec, w := eightHandled(t, "publisher-cut-short")

	busy, gate := make(chan struct{}), make(chan struct{})
	var published int64
	var headErr error
	w.sys.Root.Send(w.rt.publisher, inspectPublisher(func(p *publisher, _ actor.Context) {
		close(busy)
		<-gate
		// Published, never posted: the batches of a fetch this
		// incarnation has not taken (it is busy) go to its successor,
		// which ignores them.
		published, headErr = p.store.HeadPosition(context.Background())
		p.setPos(published)
		panic(errors.New("test: the publisher fails mid-broadcast"))
	}))
	<-busy
	seed(t, store, "acct", 4, 8)
	head := func() int64 {
		h, err := store.HeadPosition(context.Background())
		require.NoError(t, err)
		return h
	}
	pgtest.Eventually(t, waitLong, func() bool { return head() == 16 }, "the 8 new events sequenced (head %d)", observed(head))
	close(gate)
	w.requireSixteenHandledOnce(t, rec)
	require.NoError(t, headErr)
	require.EqualValues(t, 16, published, "the failed incarnation published the 8 events it never posted")
}

// eightHandled starts a worker of a two-bucket group sub and waits until
// it has handled 8 events seeded over 4 streams: the publisher has
// subscribers, and has posted them batches.
func eightHandled(t *testing.T, sub string) (*eventsource.Store, *recorder, *testWorker) {
	t.Helper()
	store, schema := newTestStore(t)
	rec := newRecorder()
	w := startWorker(t, schema, "w", groupOpts(sub, 2, rec, "w"))
	seed(t, store, "acct", 4, 8)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 8 }, "the first 8 events handled (got %d)%s",
		observed(rec.distinct), observed(w.diagnose))
	return store, rec, w
}

// requireSixteenHandledOnce waits until the 8 events seeded after the
// publisher failed are handled too, each once.
func (w *testWorker) requireSixteenHandledOnce(t *testing.T, rec *recorder) {
	t.Helper()
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 16 },
		"every event appended after the publisher's restart handled (got %d of 16)%s", observed(rec.distinct), observed(w.diagnose))
	require.Zero(t, rec.duplicates())
}
