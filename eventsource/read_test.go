package eventsource_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/kumi-run/kumi/eventsource"
)

func TestReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AStreamReadsForwardAndBackwardInPages", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for i := range 10 {
			mustAppend(t, s, "order-1", ev("E", fmt.Sprintf(`{"i":%d}`, i)))
		}
		mustAppend(t, s, "order-2", ev("Other", `{}`))

		var fwd []int64
		for from := int64(0); ; {
			page, err := s.ReadStream(ctx, "order-1", from, 3)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				fwd = append(fwd, e.Version)
				require.Equal(t, "order-1", e.Stream)
			}
			from = page[len(page)-1].Version + 1
		}
		require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, fwd)

		var back []int64
		for from := int64(-1); ; {
			page, err := s.ReadStreamBackward(ctx, "order-1", from, 4)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				back = append(back, e.Version)
			}
			from = page[len(page)-1].Version - 1
			if from < 0 {
				break
			}
		}
		require.Equal(t, []int64{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}, back)

		last, err := s.ReadStreamBackward(ctx, "order-1", -1, 1)
		require.NoError(t, err)
		require.Equal(t, int64(9), last[0].Version, "backward from -1 starts at the end")
		none, err := s.ReadStream(ctx, "order-404", 0, 0)
		require.NoError(t, err)
		require.Empty(t, none)
	})

	t.Run("UnsequencedEventsAreInTheirStreamButNotYetInGlobalOrder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustAppend(t, s, "order-1", ev("E", `{}`))
		got, err := s.ReadStream(ctx, "order-1", 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Zero(t, got[0].Position)
		cat, err := s.ReadCategory(ctx, "order", 0, 0)
		require.NoError(t, err)
		require.Empty(t, cat)
		sequenceAll(t, s)
		got, err = s.ReadStream(ctx, "order-1", 0, 0)
		require.NoError(t, err)
		require.Equal(t, int64(1), got[0].Position)
	})

	t.Run("CategoryAndAllPageInGlobalOrder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for i := range 12 {
			cat := []string{"order", "invoice", "order"}[i%3]
			mustAppend(t, s, fmt.Sprintf("%s-%d", cat, i%4), ev("E", fmt.Sprintf(`{"i":%d}`, i)))
		}
		sequenceAll(t, s)
		var orders, all []int64
		for after := int64(0); ; {
			page, err := s.ReadCategory(ctx, "order", after, 5)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				require.Equal(t, "order", e.Category)
				orders = append(orders, e.Position)
			}
			after = page[len(page)-1].Position
		}
		require.Len(t, orders, 8)
		require.IsIncreasing(t, orders)
		for after := int64(0); ; {
			page, err := s.ReadAll(ctx, after, 5)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				all = append(all, e.Position)
			}
			after = page[len(page)-1].Position
		}
		require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, all)
	})

	t.Run("RecordedEventsCarryWhatWasAppended", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		e := ev("Deposited", `{"amount": 42, "nested": {"a": [1, 2]}}`)
		e.Metadata = json.RawMessage(`{"user": "ann"}`)
		res := mustAppend(t, s, "account-7+snapshot", e)
		sequenceAll(t, s)
		got, err := s.ReadAll(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 1)
		r := got[0]
		require.Equal(t, res.IDs[0], r.ID)
		require.Equal(t, "account-7+snapshot", r.Stream)
		require.Equal(t, "account", r.Category)
		require.Equal(t, int64(0), r.Version)
		require.Equal(t, int64(1), r.Position)
		require.Equal(t, eventsource.Hash("7"), r.Hash)
		require.Equal(t, "Deposited", r.Type)
		require.JSONEq(t, `{"amount": 42, "nested": {"a": [1, 2]}}`, string(r.Data))
		require.JSONEq(t, `{"user": "ann"}`, string(r.Metadata))
		require.False(t, r.RecordedAt.IsZero())
	})

	t.Run("TraceContextTravelsInMetadata", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
		spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
		spanCtx := trace.ContextWithSpanContext(ctx, sc)

		withMeta := ev("Traced", `{}`)
		withMeta.Metadata = json.RawMessage(`{"user": "ann"}`)
		own := ev("OwnParent", `{}`)
		own.Metadata = json.RawMessage(`{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}`)
		_, err := s.Append(spanCtx, "order-1", eventsource.Any, []eventsource.EventData{ev("Traced", `{}`), withMeta, own})
		require.NoError(t, err)
		got, err := s.ReadStream(ctx, "order-1", 0, 0)
		require.NoError(t, err)

		var m map[string]string
		require.NoError(t, json.Unmarshal(got[0].Metadata, &m))
		require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", m["traceparent"])
		require.NoError(t, json.Unmarshal(got[1].Metadata, &m))
		require.Equal(t, "ann", m["user"], "the caller's metadata is kept")

		handlerCtx := eventsource.TraceContext(ctx, got[1].Metadata)
		remote := trace.SpanContextFromContext(handlerCtx)
		require.True(t, remote.IsRemote())
		require.Equal(t, traceID, remote.TraceID())
		require.Equal(t, spanID, remote.SpanID())

		ownCtx := eventsource.TraceContext(ctx, got[2].Metadata)
		require.Equal(t, "11111111111111111111111111111111", trace.SpanContextFromContext(ownCtx).TraceID().String(),
			"a traceparent given by the caller is not overwritten")

		require.Equal(t, ctx, eventsource.TraceContext(ctx, nil))
		require.Equal(t, ctx, eventsource.TraceContext(ctx, json.RawMessage(`{"traceparent": 5}`)))
	})
}

// Positions are kept per append (docs/design/eventsource.md, "Sequencing
// appends"): every read gives each event of an append its own position,
// pages that end inside an append continue after the last event returned,
// and every kind of read agrees on each event's position.
func TestPagesSplitAppends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	batch := func(n int) []eventsource.EventData {
		out := make([]eventsource.EventData, n)
		for i := range out {
			out[i] = ev("E", fmt.Sprintf(`{"i":%d}`, i))
		}
		return out
	}
	mustAppend(t, s, "order-1", batch(5)...)
	mustAppend(t, s, "user-1", batch(2)...)
	mustAppend(t, s, "order-2", batch(4)...)
	mustAppend(t, s, "order-1", batch(3)...)
	sequenceAll(t, s)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 2))

	// pages reads from 0 in pages of limit and returns the events.
	pages := func(limit int, read func(after int64, limit int) ([]eventsource.RecordedEvent, error)) []eventsource.RecordedEvent {
		var out []eventsource.RecordedEvent
		for after := int64(0); ; {
			page, err := read(after, limit)
			require.NoError(t, err)
			if len(page) == 0 {
				return out
			}
			require.LessOrEqual(t, len(page), limit)
			out = append(out, page...)
			after = page[len(page)-1].Position
		}
	}
	byStream := map[string]map[int64]int64{} // stream → version → position
	for _, limit := range []int{1, 2, 3, 100} {
		all := pages(limit, func(after int64, limit int) ([]eventsource.RecordedEvent, error) { return s.ReadAll(ctx, after, limit) })
		require.Len(t, all, 14, "limit %d", limit)
		for i, e := range all {
			require.Equal(t, int64(i+1), e.Position, "limit %d: dense, each once", limit)
			if byStream[e.Stream] == nil {
				byStream[e.Stream] = map[int64]int64{}
			}
			byStream[e.Stream][e.Version] = e.Position
		}
		orders := pages(limit, func(after int64, limit int) ([]eventsource.RecordedEvent, error) {
			return s.ReadCategory(ctx, "order", after, limit)
		})
		require.Len(t, orders, 12, "limit %d", limit)
		members := 0
		for m := range 2 {
			got := pages(limit, func(after int64, limit int) ([]eventsource.RecordedEvent, error) {
				return s.ReadBucket(ctx, "order", m, 2, after, limit)
			})
			members += len(got)
			orders = append(orders, got...)
		}
		require.Equal(t, 12, members, "limit %d", limit)
		for _, e := range orders {
			require.Equal(t, byStream[e.Stream][e.Version], e.Position, "limit %d: %s@%d", limit, e.Stream, e.Version)
		}
	}
	require.Equal(t, map[int64]int64{0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 5: 12, 6: 13, 7: 14}, byStream["order-1"])
	for stream, positions := range byStream {
		events, err := s.ReadStream(ctx, stream, 0, 0)
		require.NoError(t, err)
		require.Len(t, events, len(positions))
		for _, e := range events {
			require.Equal(t, positions[e.Version], e.Position, "%s@%d", stream, e.Version)
		}
	}
	// A member's lag counts the events after a cursor inside an append.
	n, _, err := s.BucketLag(ctx, "order", eventsource.BucketOf(eventsource.StreamName{CardinalID: "1"}, 2), 2, 3)
	require.NoError(t, err)
	want := int64(5) // order-1's versions 3, 4 (positions 4, 5) and 5–7 (12–14)
	if eventsource.BucketOf(eventsource.StreamName{CardinalID: "2"}, 2) == eventsource.BucketOf(eventsource.StreamName{CardinalID: "1"}, 2) {
		want += 4 // order-2, positions 8–11
	}
	require.Equal(t, want, n)
}
