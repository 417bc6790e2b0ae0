package actors

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/supervision"
)

// retryFirst is a handler that answers the first event delivered in each
// bucket with a Retry whose backoff outlasts the test (on its first attempt
// only, or on every attempt when always is set), and acks every other
// event. With MaxInFlight above 1, the events of the bucket's other streams
// are acked meanwhile: they lie beyond the acked prefix, which stops before
// the retried event.
type retryFirst struct {
	rec    *recorder
	worker string
	always bool

	mu      sync.Mutex
	retried map[int]retriedEvent // by bucket
}

type retriedEvent struct {
	id       uuid.UUID
	stream   string
	position int64
	attempts int // deliveries of it seen
}

func (e retriedEvent) String() string {
	return fmt.Sprintf("%s (stream %s, position %d, %d deliveries)", e.id, e.stream, e.position, e.attempts)
}

func (h *retryFirst) props() *actor.Props {
	return actor.PropsFromFunc(func(ctx actor.Context) {
		d, ok := ctx.Message().(*Delivery)
		if !ok {
			return
		}
		h.mu.Lock()
		ev, seen := h.retried[d.Bucket]
		if !seen {
			ev = retriedEvent{id: d.Event.ID, stream: d.Event.Stream, position: d.Event.Position}
		}
		mine := ev.id == d.Event.ID
		if mine {
			ev.attempts++
			h.retried[d.Bucket] = ev
		}
		h.mu.Unlock()
		if mine && (h.always || d.Attempt == 0) {
			ctx.Respond(Retry{After: time.Hour, Reason: "not yet"})
			return
		}
		h.rec.begin(h.worker, d.Event)
		h.rec.end(h.worker, d.Event)
		ctx.Respond(Ack{})
	})
}

// events returns the retried events, by bucket.
func (h *retryFirst) events() map[int]retriedEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[int]retriedEvent, len(h.retried))
	for b, ev := range h.retried {
		out[b] = ev
	}
	return out
}

// repeated lists the events handled more than once, with their counts.
func (r *recorder) repeated() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id, n := range r.count {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s×%d", id, n))
		}
	}
	sort.Strings(out)
	return out
}

// The drain of a handoff or of a graceful stop, with MaxInFlight above 1:
// an event answered Retry, with its backoff still running, while events of
// other streams after it were acked. The drain sends the retried event once
// more at once, and, answered, the checkpoint passes it and the events
// acked after it: the next owner delivers none of them again. (Before, the
// drain left the retried event to the next owner with the checkpoint
// before it, and the next owner delivered again every event acked after
// it.)
func TestADrainRunsARetryToItsAnswerSoTheNextOwnerRepeatsNothing(t *testing.T) {
	t.Parallel()
	const streams, perStream = 16, 2
	total := streams * perStream
	store, schema := newTestStore(t)
	seed(t, store, "acct", streams, total)
	rec := newRecorder()
	h := &retryFirst{rec: rec, worker: "w1", retried: map[int]retriedEvent{}}
	o := groupOpts("drainretry", 2, nil, "w1")
	o.Handler, o.MaxInFlight = h.props(), total
	w1 := startWorker(t, schema, "w1", o)
	// Each bucket's first event waits out its backoff (an hour); every
	// event of the other streams is acked.
	pgtest.Eventually(t, waitLong, func() bool {
		return len(h.events()) == 2 && rec.distinct() == total-2*perStream
	}, "w1 acks all but the retried streams (retried %v, acked %d of %d)%s",
		observed(h.events), observed(rec.distinct), total-2*perStream, observed(w1.diagnose))

	// A handoff: w2 joins and claims one of w1's two buckets.
	o2 := groupOpts("drainretry", 2, rec, "w2")
	o2.MaxInFlight = total
	w2 := startWorker(t, schema, "w2", o2)
	pgtest.Eventually(t, waitLong, func() bool {
		return len(w2.owned()) == 1 && rec.distinct() == total-perStream
	}, "w2 takes a bucket over and handles its retried stream (w2 owns %v; handled %d of %d)%s",
		observed(w2.owned), observed(rec.distinct), total-perStream, observed(w2.diagnose))
	require.Empty(t, rec.repeated(), "events handled again after the handoff (w1's retried events: %v)", h.events())

	// A graceful stop: w2 takes w1's other bucket over.
	w1.stop(t)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == total },
		"w2 handles the rest after w1's stop (handled %d of %d)%s", observed(rec.distinct), total, observed(w2.diagnose))
	require.Empty(t, rec.repeated(), "events handled again after the graceful stop (w1's retried events: %v)", h.events())
	for b, ev := range h.events() {
		require.Equal(t, 2, ev.attempts, "bucket %d: the retried event's deliveries by w1: the first, and the drain's", b)
	}
}

// The one repeat a drain leaves, with MaxInFlight above 1: an event whose
// handler answers Retry again to the drain's attempt (or panics, or times
// out) is left to the next owner, the checkpoint before it; the events of
// other streams after it that this owner finished are delivered again by
// the next owner. Exactly those.
func TestADrainLeavesAnEventStillFailingAndTheNextOwnerRepeatsWhatFollowedIt(t *testing.T) {
	t.Parallel()
	const streams, perStream = 8, 2
	total := streams * perStream
	store, schema := newTestStore(t)
	seed(t, store, "acct", streams, total)
	rec := newRecorder()
	h := &retryFirst{rec: rec, worker: "w1", always: true, retried: map[int]retriedEvent{}}
	o := groupOpts("drainleft", 1, nil, "w1")
	o.Handler, o.MaxInFlight, o.Retry.MaxAttempts = h.props(), total, 100
	w1 := startWorker(t, schema, "w1", o)
	pgtest.Eventually(t, waitLong, func() bool { return len(h.events()) == 1 && rec.distinct() == total-perStream },
		"w1 acks all but the retried stream (retried %v, acked %d of %d)%s",
		observed(h.events), observed(rec.distinct), total-perStream, observed(w1.diagnose))
	ackedByW1 := rec.distinct()
	w1.stop(t)
	ev := h.events()[0]
	require.Equal(t, 2, ev.attempts, "the retried event's deliveries by w1: the first, and the drain's")

	o2 := groupOpts("drainleft", 1, rec, "w2")
	o2.MaxInFlight = total
	w2 := startWorker(t, schema, "w2", o2)
	// Every event w1 acked lies after the retried one (the bucket's first):
	// each is handled again, once; nothing else is. (The retried stream's
	// events may be handled before the repeats: wait for both.)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == total && rec.duplicates() >= ackedByW1 },
		"w2 handles everything and repeats what w1 acked (handled %d of %d, repeats %d of %d)%s", observed(rec.distinct),
		total, observed(rec.duplicates), ackedByW1, observed(w2.diagnose))
	require.Equal(t, ackedByW1, rec.duplicates(), "repeats: %v", rec.repeated())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, 1, rec.count[ev.id], "the retried event, handled once, by w2")
}

// A reader stopped unsure of its lease while its event waits out a retry's
// backoff sends nothing more, and leaves the event to the reader the
// coordinator spawns next at the same epoch once the lease is renewed.
// That reader goes on with the event's attempts: the next delivery is a
// retry, Attempt one above the last, charged to the same budget. (Before,
// it delivered the event as new, Attempt 0 — the same worker delivering
// one event twice at one epoch as a first attempt, and an event failing
// across such stops never used up its retry budget.)
func TestARetryLeftByAnUnsureReaderKeepsItsAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	var mu sync.Mutex
	var attempts []int // of the retried event, in delivery order
	seen := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), attempts...)
	}
	var failing atomic.Bool
	failing.Store(true)
	u := startUnsureIn(t, schema, "unsureretry", func(o *GroupOptions, rec *recorder) {
		o.Retry = RetryPolicy{MaxAttempts: 1_000_000, Backoff: supervision.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}}
		o.Handler = actor.PropsFromFunc(func(ctx actor.Context) {
			d, ok := ctx.Message().(*Delivery)
			if !ok {
				return
			}
			if d.Event.Type == "Retried" {
				mu.Lock()
				attempts = append(attempts, d.Attempt)
				mu.Unlock()
				if failing.Load() {
					ctx.Respond(Retry{Reason: "not yet"})
					return
				}
			}
			rec.begin("w", d.Event)
			rec.end("w", d.Event)
			ctx.Respond(Ack{})
		})
	}, nil)
	before := holders(t, schema, "unsureretry")
	_, err := u.store.Append(ctx, "acct-r", eventsource.Any, []eventsource.EventData{{Type: "Retried", Data: []byte(`{}`)}})
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return len(seen()) >= 2 }, "the event is retried (attempts %v)", observed(seen))

	release := u.holdRenewals(t)
	defer release()
	// A redelivery finds the lease unsure: the reader stops, the event
	// left retrying.
	pgtest.Eventually(t, waitLong, func() bool { return u.fenceLost() && len(u.w.owned()) == 0 },
		"the reader stops on the unsure lease (owned %v)%s", observed(u.w.owned), observed(u.w.diagnose))
	failing.Store(false)
	release() // the renewal lands: the lease was held all along

	pgtest.Eventually(t, waitLong, func() bool { return u.rec.distinct() == 51 }, "the event handled by the respawned reader (got %d)%s",
		observed(u.rec.distinct), observed(u.w.diagnose))
	require.Equal(t, before, holders(t, schema, "unsureretry"), "the bucket held at the same epoch throughout")
	got := seen()
	for i := 1; i < len(got); i++ {
		require.Equal(t, got[i-1]+1, got[i], "delivery %d of the event: each one attempt above the last (attempts %v)", i, got)
	}
	require.Zero(t, u.rec.duplicates())
}
