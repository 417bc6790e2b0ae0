package eventsource

import (
	"context"
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
	if err := ValidateCategory(category); err != nil {
		return 0, time.Time{}, err
	}
	if err := checkGroup(bucket, size); err != nil {
		return 0, time.Time{}, err
	}
	var n int64
	var oldest *time.Time
	err := s.pool.QueryRow(ctx, bucketLag(s.q, size), category, bucket, after, MaxLagCount).Scan(&n, &oldest)
	if oldest == nil {
		return n, time.Time{}, err
	}
	return n, *oldest, err
}

// MaxLagCount caps [Store.BucketLag]'s count.
const MaxLagCount = 100_000
