package pgtest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SourceLinesOutside returns, as "path:line: text", every line that match
// accepts in the non-test Go files under root, except those under own
// (and hidden and testdata folders): what a package's test uses to show
// that no other package names its tables.
func SourceLinesOutside(root, own string, match func(line string) bool) ([]string, error) {
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != root &&
			(path == own || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir(), !strings.HasSuffix(path, ".go"), strings.HasSuffix(path, "_test.go"):
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if match(line) {
				found = append(found, path+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
		return nil
	})
	return found, err
}
