package eventsource_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// The former names ("member" for a bucket) still compile and mean what
// the new ones do.
func TestDeprecatedNamesMeanTheNewOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.ErrorIs(t, eventsource.ErrInvalidMember, eventsource.ErrInvalidBucket)
	for _, h := range []int64{-7, 0, 5, 1 << 62} {
		require.Equal(t, eventsource.BucketOfHash(h, 3), eventsource.Member(h, 3))
	}

	s := newStore(t)
	for _, stream := range []string{"order-1", "order-2", "order-3", "order-4"} {
		mustAppend(t, s, stream, ev("Placed", `{}`))
	}
	sequenceAll(t, s)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 2))
	for b := range 2 {
		want, err := s.ReadBucket(ctx, "order", b, 2, 0, 100)
		require.NoError(t, err)
		got, err := s.ReadMember(ctx, "order", b, 2, 0, 100)
		require.NoError(t, err)
		require.Equal(t, want, got)
		got, err = s.ReadMemberBounded(ctx, "order", b, 2, 0, 100, 1)
		require.NoError(t, err)
		require.Equal(t, want[:1], got)
		wantN, wantOldest, err := s.BucketLag(ctx, "order", b, 2, 0)
		require.NoError(t, err)
		n, oldest, err := s.MemberLag(ctx, "order", b, 2, 0)
		require.NoError(t, err)
		require.Equal(t, wantN, n)
		require.Equal(t, wantOldest, oldest)
	}
	_, err := s.ReadMember(ctx, "order", 2, 2, 0, 1)
	require.ErrorIs(t, err, eventsource.ErrInvalidBucket)
}
