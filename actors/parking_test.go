package actors

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// parkingHandlers are the handler shapes a parked stream must hold for:
// each dead-letters the event of stream poison at version 2 and records
// the others.
func parkingHandler(kind string, rec *recorder, store *eventsource.Store, poison string) (*actor.Props, func(*GroupOptions)) {
	bad := func(e eventsource.RecordedEvent) bool { return e.Stream == poison && e.Version == 2 }
	fn := func(ctx context.Context, d *Delivery) error {
		if bad(d.Event) {
			return Permanent(errors.New("poison"))
		}
		rec.begin("w", d.Event)
		rec.end("w", d.Event)
		return nil
	}
	switch kind {
	case "actor":
		return actor.PropsFromFunc(func(ctx actor.Context) {
			if d, ok := ctx.Message().(*Delivery); ok {
				if bad(d.Event) {
					ctx.Respond(DeadLetter{Reason: "poison"})
					return
				}
				rec.begin("w", d.Event)
				rec.end("w", d.Event)
				ctx.Respond(Ack{})
			}
		}), func(*GroupOptions) {}
	case "runs":
		return Func(fn), func(*GroupOptions) {}
	case "inflight":
		return Func(fn), func(o *GroupOptions) { o.MaxInFlight = 4 }
	case "batches":
		return Func(fn), func(o *GroupOptions) { o.Batch = BatchOptions{MaxEvents: 10} }
	case "exactlyonce":
		return Func(func(ctx context.Context, d *Delivery) error {
			if bad(d.Event) {
				return Permanent(errors.New("poison"))
			}
			return CommitWithCheckpoint(ctx, store, d, func(context.Context, pgx.Tx) error {
				rec.begin("w", d.Event)
				rec.end("w", d.Event)
				return nil
			})
		}), func(*GroupOptions) {}
	}
	panic(kind)
}

// lastOfBucket is the position of the last event of category in bucket b
// of n.
func lastOfBucket(t *testing.T, store *eventsource.Store, category string, b, n int) int64 {
	t.Helper()
	ctx := context.Background()
	head, err := store.HeadPosition(ctx)
	require.NoError(t, err)
	var last int64
	for after := int64(0); ; {
		page, err := store.ReadBucketPage(ctx, category, b, n, eventsource.Page{After: after, Known: head, Limit: 1000})
		require.NoError(t, err)
		if len(page) == 0 {
			return last
		}
		last = page[len(page)-1].Position
		after = last
	}
}

// A subscription that parks (OnDeadLetter ParkStream): a dead letter in
// one stream parks it, fenced; the stream's later events are never
// delivered while the bucket's other streams go on and its checkpoint
// passes them, the stream's last included; a new owner (the worker
// stopped, another started) finds it parked and goes on skipping it. For
// every handler shape: single deliveries, a function handler's runs,
// several in flight, batches, and exactly-once commits.
func TestAParkedStreamWaitsWhileItsBucketGoesOn(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"actor", "runs", "inflight", "batches", "exactlyonce"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, schema := newTestStore(t)
			const n, sub, poison = 2, "parks", "acct-1"
			b := eventsource.BucketOf(eventsource.StreamName{CardinalID: "1"}, n)
			neighbour := ""
			for i := 2; neighbour == ""; i++ {
				if eventsource.BucketOf(eventsource.StreamName{CardinalID: fmt.Sprint(i)}, n) == b {
					neighbour = fmt.Sprintf("acct-%d", i)
				}
			}
			seed(t, store, "acct", 8, 79)
			_, err := store.Append(ctx, poison, eventsource.Any, []eventsource.EventData{{Type: "Last", Data: []byte(`{}`)}})
			require.NoError(t, err) // the bucket's last event is the parked stream's

			rec := newRecorder()
			handler, set := parkingHandler(kind, rec, store, poison)
			opts := groupOpts(sub, n, rec, "a")
			opts.Handler, opts.OnDeadLetter = handler, ParkStream
			set(&opts)
			a := startWorker(t, schema, "a", opts)

			// Of the poison stream's 11 events, versions 0 and 1.
			pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 71 }, "the other events handled (got %d)", observed(rec.distinct))
			last := lastOfBucket(t, store, "acct", b, n)
			pgtest.Eventually(t, waitLong, func() bool {
				p, err := store.Checkpoint(ctx, sub, b)
				return err == nil && p == last
			}, "the parked stream's bucket checkpoints through its last event, the parked stream's (%d)", last)
			parked, err := store.ParkedStreams(ctx, sub, eventsource.ParkedFilter{})
			require.NoError(t, err)
			require.Len(t, parked, 1)
			p := parked[0]
			require.Equal(t, poison, p.Stream)
			require.EqualValues(t, 2, p.Version)
			require.EqualValues(t, 2, p.DoneVersion)
			require.EqualValues(t, 8, p.Waiting)
			require.Empty(t, p.Action)
			letters, err := store.DeadLetters(ctx, sub, eventsource.DeadLetterFilter{})
			require.NoError(t, err)
			require.Len(t, letters, 1)
			require.Equal(t, p.EventID, letters[0].EventID)
			require.Equal(t, b, letters[0].Bucket)
			rec.mu.Lock()
			require.EqualValues(t, 1, rec.lastVer[poison], "nothing of the parked stream after its letter is delivered")
			rec.mu.Unlock()
			require.Zero(t, rec.duplicates())
			require.Empty(t, rec.order)

			// A new owner, at a new epoch: the stream stays parked.
			a.stop(t)
			for range 3 {
				for _, s := range []string{poison, neighbour} {
					_, err := store.Append(ctx, s, eventsource.Any, []eventsource.EventData{{Type: "After", Data: []byte(`{}`)}})
					require.NoError(t, err)
				}
			}
			opts.Worker = "b"
			startWorker(t, schema, "b", opts)
			pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 74 }, "the neighbour's new events handled (got %d)", observed(rec.distinct))
			last = lastOfBucket(t, store, "acct", b, n)
			pgtest.Eventually(t, waitLong, func() bool {
				p, err := store.Checkpoint(ctx, sub, b)
				return err == nil && p == last
			}, "the new owner checkpoints through the parked stream's new events (%d)", last)
			parked, err = store.ParkedStreams(ctx, sub, eventsource.ParkedFilter{})
			require.NoError(t, err)
			require.Len(t, parked, 1)
			require.EqualValues(t, 11, parked[0].Waiting)
			rec.mu.Lock()
			require.EqualValues(t, 1, rec.lastVer[poison], "the new owner delivers nothing of the parked stream")
			rec.mu.Unlock()
			require.Zero(t, rec.duplicates())
		})
	}
}
