package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var kumiEnv = regexp.MustCompile(`\bKUMI_[A-Z0-9_]*[A-Z0-9]\b`)

// Every KUMI_* environment variable README.md and docs/ name is spelled
// somewhere in the code (a Go file, a script under tools/ or the
// Makefile): a doc may not go on naming a variable nothing reads.
func TestDocsNameOnlyEnvironmentVariablesTheCodeReads(t *testing.T) {
	var code strings.Builder
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if n := e.Name(); p != root && (strings.HasPrefix(n, ".") || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") || strings.HasSuffix(p, ".sh") || e.Name() == "Makefile" {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			code.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	all := code.String()
	for _, doc := range documents(t) {
		seen := map[string]bool{}
		for _, v := range kumiEnv.FindAllString(read(t, doc), -1) {
			if seen[v] {
				continue
			}
			seen[v] = true
			if !strings.Contains(all, v) {
				t.Errorf("%s: %s: no code reads this variable", doc, v)
			}
		}
	}
}
