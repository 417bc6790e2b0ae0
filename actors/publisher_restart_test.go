package actors

import (
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

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
	store, schema := newTestStore(t)
	rec := newRecorder()
	w := startWorker(t, schema, "w", groupOpts("publisher-restart", 2, rec, "w"))
	seed(t, store, "acct", 4, 8)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 8 }, "the first 8 events handled (got %d)%s",
		observed(rec.distinct), observed(w.diagnose))

	failed := make(chan struct{})
	w.sys.Root.Send(w.rt.publisher, inspectPublisher(func(*publisher, actor.Context) {
		close(failed)
		panic(errors.New("test: the publisher fails"))
	}))
	<-failed
	seed(t, store, "acct", 4, 8)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 16 }, "every event appended after the publisher's restart handled (got %d of 16)%s",
		observed(rec.distinct), observed(w.diagnose))
	require.Zero(t, rec.duplicates())
}
