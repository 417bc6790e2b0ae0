package eventsource_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// Dead letters carry the generation of the bucket that gave up on the
// event (docs/design/resize.md): listed and filtered by generation, and a letter
// of a retired generation replays as any other.
func TestDeadLetterGeneration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupDeadLetters(t, 6)
	add := func(e eventsource.RecordedEvent, gen, bucket int) eventsource.DeadLetter {
		t.Helper()
		d, err := b.s.AddDeadLetter(ctx, eventsource.DeadLetter{
			Subscription: "orders", Generation: gen, Bucket: bucket, EventID: e.ID, Reason: "boom", Attempts: 3,
		})
		require.NoError(t, err)
		require.Equal(t, gen, d.Generation)
		return d
	}
	add(b.events[0], 0, 3) // generation 0, bucket 3
	add(b.events[1], 1, 3) // generation 1, bucket 3: other streams
	add(b.events[2], 1, 5)
	add(b.events[3], 0, 1) // an older worker's letter: generation 0

	got, err := b.s.DeadLetter(ctx, "orders", b.events[1].ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Generation)
	require.Equal(t, 3, got.Bucket)

	list := func(f eventsource.DeadLetterFilter) []int64 {
		t.Helper()
		ds, err := b.s.DeadLetters(ctx, "orders", f)
		require.NoError(t, err)
		var out []int64
		for _, d := range ds {
			out = append(out, d.Position)
		}
		return out
	}
	zero, one, three := 0, 1, 3
	pos := func(i ...int) []int64 {
		var out []int64
		for _, j := range i {
			out = append(out, b.events[j].Position)
		}
		return out
	}
	require.Equal(t, pos(0, 1, 2, 3), list(eventsource.DeadLetterFilter{}), "no filter: every generation")
	require.Equal(t, pos(1, 2), list(eventsource.DeadLetterFilter{Generation: &one}))
	require.Equal(t, pos(0, 3), list(eventsource.DeadLetterFilter{Generation: &zero}))
	require.Equal(t, pos(1), list(eventsource.DeadLetterFilter{Generation: &one, Bucket: &three}), "bucket 3 of generation 1")
	require.Equal(t, pos(0), list(eventsource.DeadLetterFilter{Generation: &zero, Bucket: &three}), "bucket 3 of generation 0")
	require.Equal(t, pos(0, 1), list(eventsource.DeadLetterFilter{Bucket: &three}), "bucket 3 of every generation")

	// The event is dead-lettered again by the new generation: the letter
	// takes its generation.
	add(b.events[0], 1, 0)
	require.Equal(t, pos(0, 1, 2), list(eventsource.DeadLetterFilter{Generation: &one}))

	// A retired generation's letter replays as any other (by event id).
	var replayed []int64
	n, err := b.s.ReplayDeadLetters(ctx, "orders", eventsource.DeadLetterFilter{Generation: &zero},
		func(_ context.Context, e eventsource.RecordedEvent) error {
			replayed = append(replayed, e.Position)
			return nil
		})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, pos(3), replayed)
	d, err := b.s.DeadLetter(ctx, "orders", b.events[3].ID)
	require.NoError(t, err)
	require.NotNil(t, d.ReplayedAt)
	require.Equal(t, 0, d.Generation)

	// Out of range: typed, nothing written.
	for _, g := range []int{-1, math.MaxInt32/eventsource.MaxGroupSize + 1} {
		_, err := b.s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "orders", Generation: g, EventID: b.events[4].ID})
		require.ErrorIs(t, err, eventsource.ErrInvalidDeadLetter, "generation %d", g)
		require.Contains(t, err.Error(), fmt.Sprintf("generation %d", g))
		_, err = b.s.DeadLetters(ctx, "orders", eventsource.DeadLetterFilter{Generation: &g})
		require.ErrorIs(t, err, eventsource.ErrInvalidDeadLetter, "filter generation %d", g)
	}
	_, err = b.s.DeadLetter(ctx, "orders", b.events[4].ID)
	require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound)
}

func TestConsumerGroupIndexName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	require.Equal(t, "events_cg_32", eventsource.ConsumerGroupIndexName(32))
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 5))
	var valid bool
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = $1::regclass`,
		s.QuotedSchema()+"."+eventsource.ConsumerGroupIndexName(5)).Scan(&valid))
	require.True(t, valid, "EnsureConsumerGroupIndex builds the index under that name")
}

// An old generation's bucket has nothing to do beyond the cut: its lag
// counts its events up to the bound only.
func TestBucketLagUntil(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 2))
	for i := range 20 {
		mustAppend(t, s, fmt.Sprintf("lag-%d", i%5), ev("E", `{}`))
	}
	sequenceAll(t, s)
	evs, err := s.ReadCategory(ctx, "lag", 0, 0)
	require.NoError(t, err)
	cut := evs[11].Position
	for b := range 2 {
		var all, upTo []eventsource.RecordedEvent
		for _, e := range evs {
			if e.Bucket(2) == b {
				all = append(all, e)
				if e.Position <= cut {
					upTo = append(upTo, e)
				}
			}
		}
		n, oldest, err := s.BucketLagUntil(ctx, "lag", b, 2, 0, cut)
		require.NoError(t, err)
		require.Equal(t, int64(len(upTo)), n, "bucket %d up to the cut", b)
		require.True(t, oldest.Equal(upTo[0].RecordedAt))
		n, _, err = s.BucketLagUntil(ctx, "lag", b, 2, upTo[0].Position, cut)
		require.NoError(t, err)
		require.Equal(t, int64(len(upTo)-1), n, "bucket %d behind its first event, up to the cut", b)
		n, _, err = s.BucketLagUntil(ctx, "lag", b, 2, cut, math.MaxInt64)
		require.NoError(t, err)
		require.Equal(t, int64(len(all)-len(upTo)), n, "bucket %d after the cut", b)
		n, oldest, err = s.BucketLagUntil(ctx, "lag", b, 2, cut, cut)
		require.NoError(t, err)
		require.Zero(t, n, "a drained bucket: nothing up to the cut")
		require.True(t, oldest.IsZero())
		m, _, err := s.BucketLag(ctx, "lag", b, 2, 0)
		require.NoError(t, err)
		require.Equal(t, int64(len(all)), m, "BucketLag has no bound")
	}
	_, _, err = s.BucketLagUntil(ctx, "lag", 2, 2, 0, cut)
	require.ErrorIs(t, err, eventsource.ErrInvalidBucket)
}
