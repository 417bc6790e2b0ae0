package eventsource

// MemberSQL exposes the statement of a consumer-group member's read, for
// a test that checks its plan.
func (s *Store) MemberSQL(size int) string { return memberRead(s.q, size).full }

// TextSize exposes the bound of an event's text form, for a test that
// checks it against PostgreSQL's.
var TextSize = textSize
