package eventsource

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// BucketLag returns how many events of category with position > after
// belong to bucket of a group of size, and when the oldest of them was
// recorded (zero when there are none): a bucket's backlog behind its
// checkpoint. It uses the consumer-group index (see
// [Store.EnsureConsumerGroupIndex]); its cost grows with the backlog, so it
// counts at most MaxLagCount events: a count of MaxLagCount means "at
// least".
func (s *Store) BucketLag(ctx context.Context, category string, bucket, size int, after int64) (int64, time.Time, error) {
	return s.BucketLagUntil(ctx, category, bucket, size, after, math.MaxInt64)
}

// BucketLagUntil is [Store.BucketLag] with an upper bound: it counts the
// events of bucket of a group of size with after < position <= until. A
// bucket of a generation that a resize ends at the cut C has no more to do
// than its events up to C (see docs/design/resize.md): its lag is
// BucketLagUntil(…, checkpoint, C). until < after counts nothing.
func (s *Store) BucketLagUntil(ctx context.Context, category string, bucket, size int, after, until int64) (int64, time.Time, error) {
	if err := ValidateCategory(category); err != nil {
		return 0, time.Time{}, err
	}
	if err := checkGroup(bucket, size); err != nil {
		return 0, time.Time{}, err
	}
	var n int64
	var oldest *time.Time
	err := s.pool.QueryRow(ctx, bucketLag(s.q, size), category, bucket, after, MaxLagCount, until).Scan(&n, &oldest)
	if oldest == nil {
		return n, time.Time{}, err
	}
	return n, *oldest, err
}

// MaxLagCount caps [Store.BucketLag]'s and [Store.BucketLagUntil]'s count.
const MaxLagCount = 100_000

// LagBucket is one bucket whose backlog [Store.BucketLags] measures.
type LagBucket struct {
	// Subscription is the subscription whose checkpoint the backlog is
	// behind; Category the category it reads.
	Subscription, Category string
	// Slot is the key of the bucket's checkpoint (the bucket itself in
	// generation 0; see docs/design/resize.md).
	Slot int
	// Bucket is the bucket of a group of Buckets.
	Bucket, Buckets int
	// Until is the last position the bucket has to deliver
	// (math.MaxInt64: none; see [Store.BucketLagUntil]).
	Until int64
}

// BucketBacklog is one bucket's backlog as [Store.BucketLags] measured
// it.
type BucketBacklog struct {
	// Checkpoint is the slot's stored checkpoint (0 when none).
	Checkpoint int64
	// Events counts the bucket's events after Checkpoint and up to Until,
	// at most MaxLagCount; Oldest is when the first of them was recorded
	// (zero when there are none).
	Events int64
	Oldest time.Time
}

// BucketLags measures the backlogs of many buckets, of any subscriptions
// and categories, in one statement: for each, its subscription's stored
// checkpoint of its slot and what [Store.BucketLagUntil] would count after
// it, all from one snapshot. The result has one entry per bucket, in the
// order given. It is what a worker process's lag gauges cost per interval,
// whatever the number of its groups and buckets.
func (s *Store) BucketLags(ctx context.Context, buckets []LagBucket) ([]BucketBacklog, error) {
	if len(buckets) == 0 {
		return nil, nil
	}
	// One branch of the statement per group size: the bucket expression
	// is written with its size, as the consumer-group index is.
	type branch struct {
		index, slots, buckets []int32
		subscriptions, cats   []string
		until                 []int64
	}
	bySize := map[int]*branch{}
	var sizes []int
	valid := map[string]bool{}
	for i, b := range buckets {
		if !valid["s"+b.Subscription] {
			if err := ValidateSubscription(b.Subscription); err != nil {
				return nil, err
			}
			valid["s"+b.Subscription] = true
		}
		if !valid["c"+b.Category] {
			if err := ValidateCategory(b.Category); err != nil {
				return nil, err
			}
			valid["c"+b.Category] = true
		}
		if err := checkGroup(b.Bucket, b.Buckets); err != nil {
			return nil, err
		}
		br := bySize[b.Buckets]
		if br == nil {
			br = &branch{}
			bySize[b.Buckets] = br
			sizes = append(sizes, b.Buckets)
		}
		br.index = append(br.index, int32(i))
		br.subscriptions, br.cats = append(br.subscriptions, b.Subscription), append(br.cats, b.Category)
		br.slots = append(br.slots, int32(b.Slot))
		br.buckets = append(br.buckets, int32(b.Bucket))
		br.until = append(br.until, b.Until)
	}
	slices.Sort(sizes)
	args := []any{int64(MaxLagCount)}
	for _, size := range sizes {
		br := bySize[size]
		args = append(args, br.index, br.subscriptions, br.cats, br.slots, br.buckets, br.until)
	}
	rows, err := s.pool.Query(ctx, bucketLagsSQL(s.q, sizes), args...)
	if err != nil {
		return nil, err
	}
	out := make([]BucketBacklog, len(buckets))
	var i int32
	var b BucketBacklog
	var oldest *time.Time
	_, err = pgx.ForEachRow(rows, []any{&i, &b.Checkpoint, &b.Events, &oldest}, func() error {
		if i < 0 || int(i) >= len(out) {
			return fmt.Errorf("eventsource: bucket lags: row %d of %d", i, len(out))
		}
		out[i] = BucketBacklog{Checkpoint: b.Checkpoint, Events: b.Events}
		if oldest != nil {
			out[i].Oldest = *oldest
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
