package actors

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// releaseRig is a subscription that parks, over 8 streams of 10 events
// (acct-0 … acct-7), whose handler dead-letters acct-1's version 2 while
// poisoned, and its version again when set; and that retries its version
// hang, an hour apart, on the worker named hangOn.
type releaseRig struct {
	store  *eventsource.Store
	schema string
	rec    *recorder
	proj   *projection // exactly-once: the handler commits through CommitWithCheckpoint
	opts   GroupOptions
	poison atomic.Bool
	hang   atomic.Int64
	hangOn string
	hung   atomic.Bool  // the hang was answered
	again  atomic.Int64 // a version of acct-1 dead-lettered (-1: none)
	// batches: the handler takes batches (Batch.MaxEvents 10), committing
	// them exactly-once (see batchHandler).
	batches bool
}

const releaseStream = "acct-1"

// newReleaseRig makes a rig whose handler is of kind: "single" (a Func),
// "exactlyonce" (a Func committing through CommitWithCheckpoint) or
// "batches" (see batchHandler).
func newReleaseRig(t *testing.T, sub, kind string) *releaseRig {
	store, schema := newTestStore(t)
	g := &releaseRig{store: store, schema: schema, rec: newRecorder(), batches: kind == "batches"}
	g.poison.Store(true)
	g.hang.Store(-1)
	g.again.Store(-1)
	if kind != "single" {
		g.proj = newProjection(t, store, schema)
	}
	seed(t, store, "acct", 8, 80)
	g.opts = groupOpts(sub, 2, g.rec, "")
	g.opts.OnDeadLetter = ParkStream
	if g.batches {
		g.opts.Batch = BatchOptions{MaxEvents: 10}
	}
	return g
}

// handler is the rig's handler for worker.
func (g *releaseRig) handler(worker string) *actor.Props {
	if g.batches {
		return g.batchHandler(worker)
	}
	return Func(func(ctx context.Context, d *Delivery) error {
		e := d.Event
		if e.Stream == releaseStream && e.Version == 2 && g.poison.Load() {
			return Permanent(errors.New("poison"))
		}
		if e.Stream == releaseStream && e.Version == g.again.Load() {
			return Permanent(errors.New("poison again"))
		}
		if e.Stream == releaseStream && e.Version == g.hang.Load() && worker == g.hangOn {
			g.hung.Store(true)
			return errors.New("hang")
		}
		if g.proj == nil {
			g.rec.begin(worker, e)
			g.rec.end(worker, e)
			return nil
		}
		return CommitWithCheckpoint(ctx, g.store, d, func(c context.Context, tx pgx.Tx) error {
			if err := g.proj.apply(d)(c, tx); err != nil {
				return err
			}
			g.rec.begin(worker, e)
			g.rec.end(worker, e)
			return nil
		})
	})
}

// batchHandler is the rig's handler as a BatchFunc committing each batch
// through CommitBatchWithCheckpoint, up to its first poisoned event.
func (g *releaseRig) batchHandler(worker string) *actor.Props {
	return BatchFunc(func(ctx context.Context, b *Batch) error {
		return CommitBatchWithCheckpoint(ctx, g.store, b, func(c context.Context, tx pgx.Tx, evs []eventsource.RecordedEvent) error {
			for i, e := range evs {
				if e.Stream == releaseStream && ((e.Version == 2 && g.poison.Load()) || e.Version == g.again.Load()) {
					return DoneUpTo(i, Permanent(errors.New("poison")))
				}
				d := &Delivery{Event: e}
				if err := g.proj.apply(d)(c, tx); err != nil {
					return err
				}
			}
			for _, e := range evs {
				g.rec.begin(worker, e)
				g.rec.end(worker, e)
			}
			return nil
		})
	})
}

// start starts a worker.
func (g *releaseRig) start(t *testing.T, worker string) *testWorker {
	opts := g.opts
	opts.Handler = g.handler(worker)
	if g.hangOn == worker {
		// The hang's Retry waits long: the release stands at its event.
		opts.Retry = RetryPolicy{MaxAttempts: 5}
		opts.Retry.Backoff = supervision.Backoff{Initial: time.Hour, Max: time.Hour, Jitter: supervision.NoJitter}
	}
	return startWorker(t, g.schema, worker, opts)
}

// parked returns the subscription's parked streams.
func (g *releaseRig) parked(t *testing.T) []eventsource.ParkedStream {
	p, err := g.store.ParkedStreams(context.Background(), g.opts.Subscription, eventsource.ParkedFilter{})
	require.NoError(t, err)
	return p
}

// waitParked waits for acct-1 parked at version 2, every other event handled.
func (g *releaseRig) waitParked(t *testing.T) {
	pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == 72 }, "the other streams handled (got %d)", observed(g.rec.distinct))
	p := g.parked(t)
	require.Len(t, p, 1)
	require.EqualValues(t, 2, p[0].Version)
	require.EqualValues(t, 7, p[0].Waiting)
}

// delivered returns the versions of acct-1 delivered, in order.
func (g *releaseRig) lastVersion() int64 {
	g.rec.mu.Lock()
	defer g.rec.mu.Unlock()
	return g.rec.lastVer[releaseStream]
}

// requireOnceInOrder checks that every event was delivered once, in its
// stream's order.
func (g *releaseRig) requireOnceInOrder(t *testing.T) {
	g.rec.mu.Lock()
	require.Empty(t, g.rec.order, "per-stream order")
	g.rec.mu.Unlock()
	require.Zero(t, g.rec.duplicates())
}

// appendTo appends n events to stream.
func appendTo(t *testing.T, store *eventsource.Store, stream string, n int) {
	for range n {
		_, err := store.Append(context.Background(), stream, eventsource.Any, []eventsource.EventData{{Type: "After", Data: []byte(`{}`)}})
		require.NoError(t, err)
	}
}

// A parked stream's release, for each operator action, with single
// deliveries, exactly-once commits and exactly-once batches: replay delivers the letter's
// event, then the events that waited, in order, and the stream flows
// again; discard delivers the events after the letter; skip delivers
// nothing of the stream, ever. Every event is delivered once, in its
// stream's order; under CommitWithCheckpoint each committed once.
func TestAReleasedStreamDeliversWhatWaitedInOrderThenFlows(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"single", "exactlyonce", "batches"} {
		for _, action := range []eventsource.ParkAction{eventsource.ParkReplay, eventsource.ParkDiscard, eventsource.ParkSkip} {
			t.Run(kind+"/"+string(action), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				g := newReleaseRig(t, "releases", kind)
				g.start(t, "a")
				g.waitParked(t)
				require.EqualValues(t, 1, g.lastVersion())

				g.poison.Store(false)
				_, err := g.store.RequestRelease(ctx, g.opts.Subscription, releaseStream, action)
				require.NoError(t, err)
				want := 80
				switch action {
				case eventsource.ParkReplay:
				case eventsource.ParkDiscard:
					want = 79
				case eventsource.ParkSkip:
					want = 72
				}
				if action != eventsource.ParkSkip {
					pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == want && len(g.parked(t)) == 0 },
						"the waiting events delivered (got %d of %d) and the row gone", observed(g.rec.distinct), want)
					require.EqualValues(t, 9, g.lastVersion())
				}

				// The stream's next events, and a neighbour's.
				appendTo(t, g.store, releaseStream, 3)
				appendTo(t, g.store, "acct-3", 3)
				want += 6
				if action == eventsource.ParkSkip {
					want -= 3
				}
				pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == want }, "the new events delivered (got %d of %d)",
					observed(g.rec.distinct), want)
				b := eventsource.BucketOf(eventsource.StreamName{CardinalID: "1"}, 2)
				last := lastOfBucket(t, g.store, "acct", b, 2)
				pgtest.Eventually(t, waitLong, func() bool {
					p, err := g.store.Checkpoint(ctx, g.opts.Subscription, b)
					return err == nil && p == last
				}, "the bucket checkpoints through its last event (%d)", last)
				g.rec.mu.Lock()
				require.Empty(t, g.rec.order, "per-stream order")
				g.rec.mu.Unlock()
				require.Zero(t, g.rec.duplicates())
				require.Equal(t, want, g.rec.distinct())
				if action == eventsource.ParkSkip {
					require.EqualValues(t, 1, g.lastVersion(), "nothing of a skipped stream is delivered")
					p := g.parked(t)
					require.Len(t, p, 1)
					require.Equal(t, eventsource.ParkSkip, p[0].Action)
				} else {
					require.EqualValues(t, 12, g.lastVersion())
				}
				pending, err := g.store.DeadLetters(ctx, g.opts.Subscription, eventsource.DeadLetterFilter{})
				require.NoError(t, err)
				all, err := g.store.DeadLetters(ctx, g.opts.Subscription, eventsource.DeadLetterFilter{IncludeReplayed: true})
				require.NoError(t, err)
				switch action {
				case eventsource.ParkReplay: // marked replayed
					require.Empty(t, pending)
					require.Len(t, all, 1)
				case eventsource.ParkDiscard: // deleted
					require.Empty(t, all)
				case eventsource.ParkSkip: // kept
					require.Len(t, pending, 1)
				}
				if g.proj != nil {
					n, over := g.proj.counts(t)
					require.Equal(t, want, n)
					require.Zero(t, over, "an effect committed twice")
				}
			})
		}
	}
}

// A release stopped half-way — its worker stops while the handler retries
// one of the stream's events — goes on with the stream's next owner from
// the row's done_version: nothing released is delivered again, nothing
// is skipped, the order holds (single deliveries and exactly-once).
func TestAReleaseGoesOnWithTheNextOwner(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"single", "exactlyonce"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			g := newReleaseRig(t, "handoff", kind)
			g.hang.Store(5)
			g.hangOn = "a"
			a := g.start(t, "a")
			g.waitParked(t)
			g.poison.Store(false)
			_, err := g.store.RequestRelease(ctx, g.opts.Subscription, releaseStream, eventsource.ParkReplay)
			require.NoError(t, err)
			pgtest.Eventually(t, waitLong, func() bool {
				p := g.parked(t)
				return g.hung.Load() && len(p) == 1 && p[0].DoneVersion == 4
			}, "the release stands at version 5, retrying it")
			require.EqualValues(t, 4, g.lastVersion())
			a.stop(t)
			require.EqualValues(t, 4, g.parked(t)[0].DoneVersion)

			g.start(t, "b")
			pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == 80 && len(g.parked(t)) == 0 },
				"the new owner releases the rest (got %d of 80)", observed(g.rec.distinct))
			appendTo(t, g.store, releaseStream, 2)
			pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == 82 }, "the stream flows (got %d)", observed(g.rec.distinct))
			g.rec.mu.Lock()
			require.Empty(t, g.rec.order, "per-stream order")
			require.Positive(t, g.rec.perWorker["b"])
			g.rec.mu.Unlock()
			require.Zero(t, g.rec.duplicates())
			if g.proj != nil {
				n, over := g.proj.counts(t)
				require.Equal(t, 82, n)
				require.Zero(t, over, "an effect committed twice")
			}
		})
	}
}

// A released event dead-lettered again parks the stream there: the
// events before it are delivered, the row stands at it with no action,
// and a second release (discard) delivers the events after it.
func TestAReleasedEventDeadLetteredAgainParksTheStreamThere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newReleaseRig(t, "again", "single")
	g.start(t, "a")
	g.waitParked(t)
	g.poison.Store(false)
	g.again.Store(5)
	_, err := g.store.RequestRelease(ctx, g.opts.Subscription, releaseStream, eventsource.ParkReplay)
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool {
		p := g.parked(t)
		return len(p) == 1 && p[0].Version == 5 && p[0].Action == ""
	}, "parked again at version 5")
	require.EqualValues(t, 4, g.lastVersion())
	require.Equal(t, 75, g.rec.distinct())
	p := g.parked(t)[0]
	require.EqualValues(t, 5, p.DoneVersion)
	require.EqualValues(t, 4, p.Waiting)

	_, err = g.store.RequestRelease(ctx, g.opts.Subscription, releaseStream, eventsource.ParkDiscard)
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == 79 && len(g.parked(t)) == 0 },
		"the events after the second letter delivered (got %d of 79)", observed(g.rec.distinct))
	require.EqualValues(t, 9, g.lastVersion())
	g.requireOnceInOrder(t)
}

// A stream parked in one generation stays parked through a resize 2 → 3
// (its events appended meanwhile wait) and is released in the new
// generation, by the bucket its hash maps to there: the letter, then
// everything that waited, in order, then the stream flows.
func TestAStreamParkedBeforeAResizeIsReleasedAfterIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newReleaseRig(t, "resized", "single")
	g.opts.Lease = resizeLease()
	w := g.start(t, "a")
	g.waitParked(t)
	resizeTo(t, g.store, g.opts.Subscription, 3, w)
	appendTo(t, g.store, releaseStream, 2)
	appendTo(t, g.store, "acct-3", 2)
	pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == 74 }, "the neighbour's new events delivered (got %d)", observed(g.rec.distinct))
	require.EqualValues(t, 1, g.lastVersion(), "still parked in the new generation")
	p := g.parked(t)
	require.Len(t, p, 1)
	require.EqualValues(t, 9, p[0].Waiting)

	g.poison.Store(false)
	_, err := g.store.RequestRelease(ctx, g.opts.Subscription, releaseStream, eventsource.ParkReplay)
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == 84 && len(g.parked(t)) == 0 },
		"released in the new generation (got %d of 84)", observed(g.rec.distinct))
	appendTo(t, g.store, releaseStream, 1)
	pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == 85 }, "the stream flows (got %d)", observed(g.rec.distinct))
	require.EqualValues(t, 12, g.lastVersion())
	g.requireOnceInOrder(t)
}

// Parking and releasing are seen: kumi.parked.streams counts the parked
// stream on its bucket while it waits and 0 once released; the release
// counts in kumi.parked.releases by action; each is a kumi.parking span
// with its event, kumi.stream.parked then kumi.stream.released.
func TestParkingIsSeenInMetricsAndSpans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newReleaseRig(t, "seen", "single")
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = mp.Shutdown(ctx); _ = tp.Shutdown(ctx) })
	tel := observability.New(observability.Options{MeterProvider: mp, TracerProvider: tp, Logger: testLoggerOrDiscard()})
	opts := g.opts
	opts.Handler = g.handler("a")
	startTracedWorker(t, g.schema, "a", opts, tel)
	g.waitParked(t)
	b := eventsource.BucketOf(eventsource.StreamName{CardinalID: "1"}, 2)
	var rm metricdata.ResourceMetrics
	parkedOn := func() map[string]float64 {
		require.NoError(t, reader.Collect(ctx, &rm))
		return sums(rm, obsname.MetricParkedStreams, obsname.AttrBucket)
	}
	require.Equal(t, map[string]float64{"0": float64(1 - b), "1": float64(b)}, parkedOn())

	g.poison.Store(false)
	_, err := g.store.RequestRelease(ctx, g.opts.Subscription, releaseStream, eventsource.ParkReplay)
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return g.rec.distinct() == 80 && parkedOn()[fmt.Sprint(b)] == 0 },
		"released, and the gauge at 0 (got %d events)", observed(g.rec.distinct))
	require.Equal(t, 1.0, sums(rm, obsname.MetricParkedReleases, obsname.AttrAction)["replay"])
	var events []string
	for _, s := range spansNamed(exp, obsname.SpanParking) {
		require.Equal(t, releaseStream, attr(s, obsname.AttrStream).AsString())
		for _, e := range s.Events {
			events = append(events, e.Name)
		}
	}
	require.Equal(t, []string{obsname.EventStreamParked, obsname.EventStreamReleased}, events)
}
