package integration

import "fmt"

// eventsWithPositions is SQL for the events of the store whose schema is q
// (quoted), each with its position, NULL while unsequenced: positions are
// kept per append, in the ranges of the appends table (docs/design/eventsource.md,
// "Sequencing appends").
func eventsWithPositions(q string) string {
	return fmt.Sprintf(`(SELECT ev.*, a.last_position - a.last_version + ev.version AS position FROM %[1]s.events ev
JOIN %[1]s.appends a ON a.stream_name = ev.stream_name AND ev.version BETWEEN a.first_version AND a.last_version)`, q)
}
