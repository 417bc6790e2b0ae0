package eventsource

import (
	"context"
	"time"
)

// The names below are kumi's former vocabulary, in which a bucket (one of
// a consumer group's N slices) was a "member". They are kept so that
// existing callers compile, and mean exactly what their new names do.

// ErrInvalidMember is the former name of [ErrInvalidBucket] (the same
// error: errors.Is matches either).
//
// Deprecated: use ErrInvalidBucket.
var ErrInvalidMember = ErrInvalidBucket

// Member is the former name of [BucketOfHash].
//
// Deprecated: use BucketOfHash.
func Member(hash int64, n int) int { return BucketOfHash(hash, n) }

// ReadMember is the former name of [Store.ReadBucket].
//
// Deprecated: use ReadBucket.
func (s *Store) ReadMember(ctx context.Context, category string, bucket, size int, after int64, limit int) ([]RecordedEvent, error) {
	return s.ReadBucket(ctx, category, bucket, size, after, limit)
}

// ReadMemberBounded is the former name of [Store.ReadBucketBounded].
//
// Deprecated: use ReadBucketBounded.
func (s *Store) ReadMemberBounded(ctx context.Context, category string, bucket, size int, after int64, limit int, maxBytes int64) ([]RecordedEvent, error) {
	return s.ReadBucketBounded(ctx, category, bucket, size, after, limit, maxBytes)
}

// MemberLag is the former name of [Store.BucketLag].
//
// Deprecated: use BucketLag.
func (s *Store) MemberLag(ctx context.Context, category string, bucket, size int, after int64) (int64, time.Time, error) {
	return s.BucketLag(ctx, category, bucket, size, after)
}
