package eventsource_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// BucketLags measures, in one statement, what BucketLagUntil counts after
// each bucket's stored checkpoint: buckets of two group sizes (a resize's
// two generations), some with a checkpoint, some bounded by a cut, of two
// subscriptions (each behind its own checkpoints) and two categories.
func TestBucketLags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 2))
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 3))
	for i := range 30 {
		mustAppend(t, s, fmt.Sprintf("lag-%d", i%7), ev("E", `{}`), ev("E", `{}`))
	}
	for i := range 5 {
		mustAppend(t, s, fmt.Sprintf("other-%d", i), ev("E", `{}`))
	}
	sequenceAll(t, s)
	evs, err := s.ReadCategory(ctx, "lag", 0, 0)
	require.NoError(t, err)
	cut := evs[31].Position
	_, err = s.SaveCheckpoint(ctx, "sub", 0, evs[5].Position, nil)
	require.NoError(t, err)
	_, err = s.SaveCheckpoint(ctx, "sub", 4, evs[40].Position, nil)
	require.NoError(t, err)
	_, err = s.SaveCheckpoint(ctx, "other-sub", 1, evs[50].Position, nil)
	require.NoError(t, err)
	buckets := []eventsource.LagBucket{
		{Subscription: "sub", Category: "lag", Slot: 0, Bucket: 0, Buckets: 2, Until: cut},
		{Subscription: "sub", Category: "lag", Slot: 1, Bucket: 1, Buckets: 2, Until: cut},
		{Subscription: "sub", Category: "lag", Slot: 3, Bucket: 0, Buckets: 3, Until: math.MaxInt64},
		{Subscription: "sub", Category: "lag", Slot: 4, Bucket: 1, Buckets: 3, Until: math.MaxInt64},
		{Subscription: "sub", Category: "lag", Slot: 5, Bucket: 2, Buckets: 3, Until: math.MaxInt64},
		{Subscription: "other-sub", Category: "lag", Slot: 1, Bucket: 1, Buckets: 2, Until: math.MaxInt64},
		{Subscription: "other-sub", Category: "other", Slot: 0, Bucket: 0, Buckets: 2, Until: math.MaxInt64},
	}
	got, err := s.BucketLags(ctx, buckets)
	require.NoError(t, err)
	require.Len(t, got, len(buckets))
	for i, b := range buckets {
		cps, err := s.Checkpoints(ctx, b.Subscription)
		require.NoError(t, err)
		var stored int64
		for _, c := range cps {
			if c.Bucket == b.Slot {
				stored = c.Position
			}
		}
		n, oldest, err := s.BucketLagUntil(ctx, b.Category, b.Bucket, b.Buckets, stored, b.Until)
		require.NoError(t, err)
		require.Equal(t, eventsource.BucketBacklog{Checkpoint: stored, Events: n, Oldest: oldest}, got[i], "%+v", b)
		require.NotZero(t, n, "%+v", b)
	}
	require.NotEqual(t, got[1], got[5], "each subscription behind its own checkpoint")

	none, err := s.BucketLags(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, none)
	_, err = s.BucketLags(ctx, []eventsource.LagBucket{{Subscription: "sub", Category: "lag", Slot: 0, Bucket: 3, Buckets: 3}})
	require.ErrorIs(t, err, eventsource.ErrInvalidBucket)
	_, err = s.BucketLags(ctx, []eventsource.LagBucket{{Category: "lag", Buckets: 3}})
	require.Error(t, err, "no subscription")
	_, err = s.BucketLags(ctx, []eventsource.LagBucket{{Subscription: "sub", Buckets: 3}})
	require.Error(t, err, "no category")
}

// Each bucket's count scans its part of the consumer-group index (an
// index or bitmap scan parameterized by the bucket and its checkpoint), as
// BucketLagUntil's does, not the category's ranges.
func TestBucketLagsScansTheConsumerGroupIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	_, err := s.Pool().Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.appends (seq, stream_name, first_version, last_version, category, cg_hash) OVERRIDING SYSTEM VALUE
SELECT k + 1, c || '-' || k, 0, 59, c, %[1]s.cg_hash(k::text)
FROM generate_series(0, 499) AS k, LATERAL (SELECT CASE WHEN k %% 3 = 0 THEN 'cg' ELSE 'noise' END AS c) cat;
INSERT INTO %[1]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT k + 1, gen_random_uuid(), c || '-' || k, c, k::text, %[1]s.cg_hash(k::text), v, 'E', '{}'
FROM generate_series(0, 499) AS k, generate_series(0, 59) AS v,
  LATERAL (SELECT CASE WHEN k %% 3 = 0 THEN 'cg' ELSE 'noise' END AS c) cat`, s.QuotedSchema()))
	require.NoError(t, err)
	_, err = s.Sequence(ctx)
	require.NoError(t, err)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 8))
	_, err = s.Pool().Exec(ctx, "ANALYZE "+s.QuotedSchema()+".appends, "+s.QuotedSchema()+".checkpoints")
	require.NoError(t, err)
	eight := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	subs, cats, until := make([]string, 8), make([]string, 8), make([]int64, 8)
	for i := range 8 {
		subs[i], cats[i], until[i] = "sub", "cg", math.MaxInt64
	}
	rows, err := s.Pool().Query(ctx, "EXPLAIN "+s.BucketLagsSQL(8), int64(eventsource.MaxLagCount), eight, subs, cats, eight, eight, until)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Regexp(t, `Index Scan (using|on) events_cg_8`, plan, "plan:\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on appends", "plan:\n%s", plan)
}
