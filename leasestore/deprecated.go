package leasestore

import "context"

// The names below are kumi's former vocabulary, in which a bucket was a
// "shard" and a worker of the pool a "member". They are kept so that
// existing callers compile, and mean exactly what their new names do.

// Member is the former name of [WorkerState].
//
// Deprecated: use WorkerState.
type Member = WorkerState

// ShardCountMismatchError is the former name of [BucketCountMismatchError].
//
// Deprecated: use BucketCountMismatchError.
type ShardCountMismatchError = BucketCountMismatchError

// ShardCountMismatch is the former name of [BucketCountMismatchError].
//
// Deprecated: use BucketCountMismatchError.
type ShardCountMismatch = BucketCountMismatchError

// EnsureShards is the former name of [Store.EnsureBuckets].
//
// Deprecated: use EnsureBuckets.
func (s *Store) EnsureShards(ctx context.Context) error { return s.EnsureBuckets(ctx) }
