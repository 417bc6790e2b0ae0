package eventsource_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// eventTables finds a statement that names one of the store's tables: a
// FROM, JOIN, INTO or UPDATE followed, on the same line, by
// <schema>.events (or checkpoints, ...), however the schema is spliced in.
var eventTables = regexp.MustCompile("(FROM|JOIN|INTO|UPDATE|TABLE)\\b[^;\\n]{0,60}?\\.(events|streams|sequencer|checkpoints|dead_letters)\\b")

// The store's statements live in this package (queries.go): no other
// package's code names its tables (tests and migrations aside), so that
// what reads or changes them is eventsource's, and tested here.
func TestNoOtherPackageNamesTheStoresTables(t *testing.T) {
	t.Parallel()
	var found []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != ".." &&
			(path == filepath.Join("..", "eventsource") || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir(), !strings.HasSuffix(path, ".go"), strings.HasSuffix(path, "_test.go"):
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if eventTables.MatchString(line) {
				found = append(found, path+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, found, "SQL naming the event store's tables outside eventsource: give eventsource the operation")
}
