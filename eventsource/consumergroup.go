package eventsource

import (
	"context"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/kumierr"
)

// Hash is the consumer-group hash of a cardinal id: the first 8 bytes of
// its MD5 digest as a big-endian signed 64-bit integer. The SQL function
// cg_hash in the store's schema computes the same value. It is stored with
// every event, so a bucket's read never hashes rows at query time.
//
// MD5 is used for its spread and its availability in stock PostgreSQL, not
// for security: a stream name chosen to collide only lands in a given
// bucket.
func Hash(cardinalID string) int64 {
	sum := md5.Sum([]byte(cardinalID))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// MaxGroupSize is the largest consumer-group size the store takes (in
// [Store.EnsureConsumerGroupIndex], [Store.ReadBucket] and
// [Store.BucketLag]): the size is written into the index expression
// ((hash % n) + n) % n, which for n beyond 2^62 overflows bigint and makes
// every sequencing UPDATE fail, store-wide. It is the store's own bound,
// at least the lease store's bound on buckets (leasestore.MaxBuckets).
const MaxGroupSize = 1 << 16

// checkGroup refuses a bucket outside [0, size) or a size outside
// [1, MaxGroupSize].
func checkGroup(bucket, size int) error {
	if size < 1 || size > MaxGroupSize || bucket < 0 || bucket >= size {
		return fmt.Errorf("%w: bucket %d of a group of %d (sizes are 1 to %d)", ErrInvalidBucket, bucket, size, MaxGroupSize)
	}
	return nil
}

// BucketOfHash is the consumer-group bucket of hash in a group of n: the
// non-negative remainder ((hash % n) + n) % n, as SQL's cg_bucket. It panics
// if n < 1.
func BucketOfHash(hash int64, n int) int {
	m := int64(n)
	return int(((hash % m) + m) % m)
}

// BucketOf returns the bucket of a stream in a group of n.
func BucketOf(stream StreamName, n int) int { return BucketOfHash(Hash(stream.CardinalID), n) }

// bucketExpr is the SQL expression of the bucket in a group of n of the
// hash column hash (cg_hash, or a qualified a.cg_hash). n is an integer
// literal so that the planner matches it to the consumer-group index.
func bucketExpr(hash string, n int) string {
	return fmt.Sprintf("(((%s %% %d) + %d) %% %d)", hash, n, n, n)
}

// cgIndexLockPoll is how often EnsureConsumerGroupIndex retries the lock
// that another process holds while it builds an index.
const cgIndexLockPoll = 50 * time.Millisecond

// EnsureConsumerGroupIndex creates, if missing, the index that makes a
// consumer-group bucket's read ([Store.ReadBucket]) of a group of n an index
// range scan. Workers call it when a subscription starts; once the index
// exists it costs one catalogue lookup per process.
//
// The index is built with CREATE INDEX CONCURRENTLY, so appends go on while
// it is built (on a large store that takes a while; create it ahead with
// `kumi migrate --group-size n` if you prefer). Several processes may call
// it at once: one builds, the others wait for it. An invalid index left by
// an interrupted build is dropped and rebuilt.
func (s *Store) EnsureConsumerGroupIndex(ctx context.Context, n int) error {
	if n < 1 || n > MaxGroupSize {
		return &kumierr.ConfigError{Field: "eventsource group size", Value: n, Reason: fmt.Sprintf("must be in [1, %d] (MaxGroupSize)", MaxGroupSize)}
	}
	s.cgMu.Lock()
	defer s.cgMu.Unlock()
	if s.cgIndexes[n] {
		return nil
	}
	name := ConsumerGroupIndexName(n)
	exists, valid, err := s.indexState(ctx, s.pool, name)
	if err != nil {
		return err
	}
	if !exists || !valid {
		if err := s.buildConsumerGroupIndex(ctx, name, n); err != nil {
			return fmt.Errorf("kumi: consumer-group index for %d buckets: %w", n, err)
		}
	}
	s.cgIndexes[n] = true
	return nil
}

// ConsumerGroupIndexName is the name, in the store's schema, of the
// consumer-group index of a group of n ([Store.EnsureConsumerGroupIndex]):
// "events_cg_<n>". A resize to n buckets checks that it exists and is
// valid before any worker reads by n (see docs/design/resize.md).
func ConsumerGroupIndexName(n int) string { return fmt.Sprintf("%s%d", cgIndexPrefix, n) }

type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) indexState(ctx context.Context, db queryRower, name string) (exists, valid bool, err error) {
	err = db.QueryRow(ctx, s.sql.indexState, s.cfg.Schema, name).Scan(&valid)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, false, nil
	}
	return err == nil, valid, err
}

// buildConsumerGroupIndex builds the index on a connection of its own,
// outside any transaction (CREATE INDEX CONCURRENTLY needs that), under a
// session advisory lock so that two processes do not build it at once.
func (s *Store) buildConsumerGroupIndex(ctx context.Context, name string, n int) (err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	key := migrate.LockKey(s.cfg.Schema + ".cg-index")
	// Poll for the lock rather than wait in pg_advisory_lock: a waiting
	// statement holds a snapshot, and the holder's CREATE INDEX
	// CONCURRENTLY waits for every older snapshot to go, so the two would
	// deadlock.
	for {
		var got bool
		if err := conn.QueryRow(ctx, advisoryTryLock, key).Scan(&got); err != nil {
			return err
		}
		if got {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cgIndexLockPoll):
		}
	}
	defer unlockSession(conn, key)

	exists, valid, err := s.indexState(ctx, conn, name)
	if err != nil || (exists && valid) {
		return err
	}
	qname := pgx.Identifier{s.cfg.Schema, name}.Sanitize()
	if exists {
		if _, err := conn.Exec(ctx, dropIndex(qname)); err != nil {
			return err
		}
	}
	_, err = conn.Exec(ctx, createConsumerGroupIndex(s.q, name, n))
	return err
}

// unlockSession releases a session advisory lock; if that fails, it closes
// the connection (which releases it) rather than return a locked
// connection to the pool.
func unlockSession(conn *pgxpool.Conn, key int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, advisoryUnlock, key); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}
