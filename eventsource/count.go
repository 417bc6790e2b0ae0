package eventsource

import (
	"context"
	"math"
	"time"
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
// than its events up to C (see docs/resize.md): its lag is
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
