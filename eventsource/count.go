package eventsource

import (
	"context"
	"fmt"
	"time"
)

// MemberLag returns how many events of category with position > after
// belong to member of a group of size, and when the oldest of them was
// recorded (zero when there are none): a bucket's backlog behind its
// checkpoint. It uses the consumer-group index (see
// [Store.EnsureConsumerGroupIndex]); its cost grows with the backlog, so it
// counts at most MaxLagCount events: a count of MaxLagCount means "at
// least".
func (s *Store) MemberLag(ctx context.Context, category string, member, size int, after int64) (int64, time.Time, error) {
	if err := ValidateCategory(category); err != nil {
		return 0, time.Time{}, err
	}
	if err := checkGroup(member, size); err != nil {
		return 0, time.Time{}, err
	}
	var n int64
	var oldest *time.Time
	// The member read's shape (see memberSQL): one range scan of the
	// consumer-group index, which no other index can serve.
	m := memberExpr(size)
	err := s.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), min(recorded_at) FROM (
  SELECT recorded_at FROM %s.events
  WHERE category = $1 AND (%s, position) > ($2, $3) AND %s <= $2 AND position IS NOT NULL
  ORDER BY %s, position LIMIT $4) lag`,
		s.q, m, m, m), category, member, after, MaxLagCount).Scan(&n, &oldest)
	if oldest == nil {
		return n, time.Time{}, err
	}
	return n, *oldest, err
}

// MaxLagCount caps [Store.MemberLag]'s count.
const MaxLagCount = 100_000
