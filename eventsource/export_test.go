package eventsource

// MemberSQL exposes the statement of a consumer-group member's read, for
// a test that checks its plan.
func (s *Store) MemberSQL(size int) string { return s.memberSQL(size) }
