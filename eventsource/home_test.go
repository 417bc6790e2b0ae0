package eventsource_test

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// eventTables finds a statement that names one of the store's tables: a
// FROM, JOIN, INTO or UPDATE followed, on the same line, by
// <schema>.events (or checkpoints, ...), however the schema is spliced in.
var eventTables = regexp.MustCompile(`(FROM|JOIN|INTO|UPDATE|TABLE)\b[^;\n]{0,60}?\.(events|appends|streams|sequencer|checkpoints|dead_letters|parked_streams)\b`)

// The store's statements live in this package (queries.go): no other
// package's code names its tables (tests and migrations aside), so that
// what reads or changes them is eventsource's, and tested here.
func TestNoOtherPackageNamesTheStoresTables(t *testing.T) {
	t.Parallel()
	found, err := pgtest.SourceLinesOutside("..", filepath.Join("..", "eventsource"), eventTables.MatchString)
	require.NoError(t, err)
	require.Empty(t, found, "SQL naming the event store's tables outside eventsource: give eventsource the operation")
}
