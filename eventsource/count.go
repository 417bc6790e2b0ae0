package eventsource

import (
	"context"
	"fmt"
)

// CountMember returns how many events of category with position > after
// belong to member of a group of size: a bucket's lag behind its
// checkpoint. It uses the consumer-group index (see
// [Store.EnsureConsumerGroupIndex]).
func (s *Store) CountMember(ctx context.Context, category string, member, size int, after int64) (int64, error) {
	if err := ValidateCategory(category); err != nil {
		return 0, err
	}
	if size < 1 || member < 0 || member >= size {
		return 0, fmt.Errorf("%w: member %d of a group of %d", ErrInvalidMember, member, size)
	}
	var n int64
	err := s.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.events WHERE category = $1 AND %s = $2 AND position > $3`,
		s.q, memberExpr(size)), category, member, after).Scan(&n)
	return n, err
}
