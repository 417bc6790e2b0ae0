package actors

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/supervision"
)

// unreadyHandler plays the handler of one bucket whose first event, X (of
// stream "acct-x"), is retried while the handler goes away: on X's first
// attempt it answers Retry{After: firstAfter} once the event of type
// "Stop" comes (so the retry's delay starts then), acks that event, and
// stops itself. Handler instances after the first stop themselves at once,
// without answering, up to stopAtStart of them; the rest answer X with
// Retry{After: an hour} (retryAgain) or Ack. Every other event is acked.
type unreadyHandler struct {
	rec         *recorder
	firstAfter  time.Duration
	stopAtStart int
	retryAgain  bool

	mu        sync.Mutex
	instances int
	held      *Delivery // X's first attempt, answered at "Stop"
	attempts  []int     // X's attempts delivered, in order
	stopped   bool
}

func (h *unreadyHandler) props() *actor.Props {
	return actor.PropsFromFunc(func(ctx actor.Context) {
		switch d := ctx.Message().(type) {
		case *actor.Started:
			h.mu.Lock()
			h.instances++
			stop := h.instances > 1 && h.instances-1 <= h.stopAtStart
			h.mu.Unlock()
			if stop {
				ctx.Stop(ctx.Self())
			}
		case *Delivery:
			h.mu.Lock()
			defer h.mu.Unlock()
			switch {
			case d.Event.Stream == "acct-x":
				h.attempts = append(h.attempts, d.Attempt)
				switch {
				case d.Attempt == 0:
					h.held = d
					return
				case h.retryAgain:
					ctx.Respond(Retry{After: time.Hour, Reason: "still not"})
					return
				}
			case d.Event.Type == "Stop" && !h.stopped:
				h.stopped = true
				h.held.Respond(ctx, Retry{After: h.firstAfter, Reason: "not yet"})
				h.rec.begin("w", d.Event)
				h.rec.end("w", d.Event)
				ctx.Respond(Ack{})
				ctx.Stop(ctx.Self())
				return
			}
			h.rec.begin("w", d.Event)
			h.rec.end("w", d.Event)
			ctx.Respond(Ack{})
		}
	})
}

func (h *unreadyHandler) xAttempts() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.attempts...)
}

// firstSlot reads the state of the window's first slot of the worker's
// only reader (ok false if it has none), on the reader's goroutine.
func (w *testWorker) firstSlot() (st string, attempt, free int, handler, ok bool) {
	pids := make(chan []*actor.PID, 1)
	w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(c *coordinator) {
		var out []*actor.PID
		for _, r := range c.readers {
			out = append(out, r.pid)
		}
		pids <- out
	}))
	var ps []*actor.PID
	select {
	case ps = <-pids:
	case <-time.After(5 * time.Second):
		return
	}
	if len(ps) != 1 {
		return
	}
	type view struct {
		st            string
		attempt, free int
		handler, ok   bool
	}
	got := make(chan view, 1)
	w.sys.Root.Send(ps[0], inspectReader(func(r *reader) {
		v := view{handler: r.handler != nil}
		v.st, v.attempt, v.free, v.ok = r.ws.st.First()
		got <- v
	}))
	select {
	case v := <-got:
		return v.st, v.attempt, v.free, v.handler, v.ok
	case <-time.After(5 * time.Second):
		return
	}
}

// startUnready seeds X, then events of seven other streams, then the Stop
// event, in one bucket, and starts a worker on them with MaxInFlight above
// 1 and the handler h.
func startUnready(t *testing.T, sub string, h *unreadyHandler, backoff supervision.Backoff) (*testWorker, *eventsource.Store) {
	t.Helper()
	ctx := context.Background()
	store, schema := newTestStore(t)
	appendOne := func(stream, typ string) {
		_, err := store.Append(ctx, stream, eventsource.Any, []eventsource.EventData{{Type: typ, Data: []byte(`{}`)}})
		require.NoError(t, err)
	}
	appendOne("acct-x", "Seeded")
	for i := range 7 {
		appendOne(fmt.Sprintf("acct-%d", i), "Seeded")
	}
	appendOne("acct-stop", "Stop")
	o := groupOpts(sub, 1, nil, "w")
	o.Handler, o.MaxInFlight = h.props(), 16
	o.HandlerTimeout = time.Minute
	o.Retry = RetryPolicy{MaxAttempts: 100, Backoff: backoff}
	return startWorker(t, schema, "w", o), store
}

// A drain that begins while the handler is being replaced — stopped, its
// successor waiting out the backoff — does not end at once: the retried
// event it has to send once more (the bucket's first, with the events of
// other streams after it acked) goes to the successor, spawned at once for
// the drain, so the checkpoint passes everything and the next owner
// repeats nothing. (Before, the drain found nothing with the handler and
// ended, the checkpoint before the retried event: the next owner delivered
// again every event acked after it.)
func TestADrainWhileTheHandlerIsReplacedSendsWhatItMust(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	h := &unreadyHandler{rec: rec, firstAfter: time.Hour}
	w, store := startUnready(t, "drainunready", h,
		supervision.Backoff{Initial: time.Hour, Max: time.Hour, Jitter: supervision.NoJitter})
	pgtest.Eventually(t, waitLong, func() bool {
		st, attempt, _, handler, ok := w.firstSlot()
		return rec.distinct() == 8 && ok && st == "retrying" && attempt == 1 && !handler
	}, "every event but X acked, X retrying, the handler replaced (handled %d, X's attempts %v)%s",
		observed(rec.distinct), observed(h.xAttempts), observed(w.diagnose))

	w.stop(t) // the graceful stop drains the reader
	require.Equal(t, []int{0, 1}, h.xAttempts(), "X: its first attempt, and the drain's")
	ctx := context.Background()
	head, err := store.HeadPosition(ctx) // every event was delivered: all are sequenced
	require.NoError(t, err)
	cp, err := store.Checkpoint(ctx, "drainunready", 0)
	require.NoError(t, err)
	require.Equal(t, head, cp, "the drain's checkpoint passes every event: the next owner repeats none")
}

// A retry whose delay passes while the handler is being replaced waits
// for the successor; a drain that begins meanwhile sends it once more, as
// the drain's one attempt of a retried event: answered Retry again, it is
// left to the next owner, not sent again. (Before, the drain sent it as a
// first send, and, answered Retry, once more.)
func TestADrainSendsARetryDueWhileTheHandlerWasAwayOnce(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	// The first handler stops after "Stop"; its successor, spawned after
	// Next(1) (50 ms), stops at once, and the next waits Next(2), 50 s.
	// X's retry falls due 2 s after "Stop", while the handler is away.
	h := &unreadyHandler{rec: rec, firstAfter: 2 * time.Second, stopAtStart: 1, retryAgain: true}
	w, _ := startUnready(t, "drainunreadydue", h,
		supervision.Backoff{Initial: 50 * time.Millisecond, Max: time.Hour, Multiplier: 1000, Jitter: supervision.NoJitter})
	pgtest.Eventually(t, waitLong, func() bool {
		st, attempt, free, handler, ok := w.firstSlot()
		return rec.distinct() == 8 && ok && st == "waiting" && attempt == 1 && free == 0 && !handler
	}, "every event but X acked, X due while the handler is away (handled %d, X's attempts %v)%s",
		observed(rec.distinct), observed(h.xAttempts), observed(w.diagnose))

	w.stop(t)
	require.Equal(t, []int{0, 1}, h.xAttempts(), "X: its first attempt, and the drain's one more")
}
