// Package snippets holds every Go block of README.md and docs/ that is a
// program (a "```go" block; a "```go listing" block lists declarations and
// is not compiled), each inside a function of this package between a
// "// snippet: FILE" line and "// end snippet", character for character
// but for one tab of indentation, and a test that runs it.
// TestEveryGoBlockOfTheDocsIsHere checks the correspondence both ways;
// README.md's embedding program is examples/quickstart/main.go, checked by
// its own test.
package snippets

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// repoRoot is the module root.
const repoRoot = "../.."

// goBlock is a fenced block of a Markdown file.
type goBlock struct {
	file, info string
	line       int // of the opening fence
	text       string
}

var fence = regexp.MustCompile("^```(go.*)$")

// docBlocks returns the ```go blocks of README.md and of every Markdown
// file under docs/.
func docBlocks(t *testing.T) []goBlock {
	t.Helper()
	files := []string{filepath.Join(repoRoot, "README.md")}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	require.NoError(t, err)
	var out []goBlock
	for _, f := range files {
		body, err := os.ReadFile(f)
		require.NoError(t, err)
		rel, _ := filepath.Rel(repoRoot, f)
		lines := strings.Split(string(body), "\n")
		for i := 0; i < len(lines); i++ {
			m := fence.FindStringSubmatch(lines[i])
			if m == nil {
				continue
			}
			b := goBlock{file: filepath.ToSlash(rel), info: m[1], line: i + 1}
			var text []string
			for i++; i < len(lines) && lines[i] != "```"; i++ {
				text = append(text, lines[i])
			}
			b.text = strings.Join(text, "\n")
			out = append(out, b)
		}
	}
	return out
}

var region = regexp.MustCompile(`(?ms)^\t// snippet: (\S+)\n(.*?)^\t// end snippet$`)

// regions returns the snippets of this package's files: file -> texts,
// de-indented by one tab.
func regions(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	out := map[string][]string{}
	for _, f := range files {
		body, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range region.FindAllStringSubmatch(string(body), -1) {
			lines := strings.Split(strings.TrimSuffix(m[2], "\n"), "\n")
			for i, l := range lines {
				lines[i] = strings.TrimPrefix(l, "\t")
			}
			out[m[1]] = append(out[m[1]], strings.Join(lines, "\n"))
		}
	}
	return out
}

// Every program block of the docs is a snippet here, and every snippet here
// is a block of the file it names.
func TestEveryGoBlockOfTheDocsIsHere(t *testing.T) {
	t.Parallel()
	quickstart, err := os.ReadFile(filepath.Join(repoRoot, "examples", "quickstart", "main.go"))
	require.NoError(t, err)
	have := regions(t)
	used := map[string]map[int]bool{}
	programs := 0
	for _, b := range docBlocks(t) {
		switch b.info {
		case "go listing":
			continue
		case "go":
		default:
			t.Errorf("%s:%d: fence %q: use ```go for a program (compiled and run here) or ```go listing for declarations", b.file, b.line, "```"+b.info)
			continue
		}
		programs++
		if b.file == "README.md" && b.text+"\n" == string(quickstart) {
			continue // examples/quickstart's own test runs it
		}
		found := false
		for i, s := range have[b.file] {
			if s == b.text {
				found = true
				if used[b.file] == nil {
					used[b.file] = map[int]bool{}
				}
				used[b.file][i] = true
			}
		}
		if !found {
			t.Errorf("%s:%d: its Go block is in no \"// snippet: %s\" region of examples/snippets: put it in one, with a test that runs it\n%s",
				b.file, b.line, b.file, b.text)
		}
	}
	for file, texts := range have {
		for i, s := range texts {
			if !used[file][i] {
				t.Errorf("examples/snippets has a snippet of %s that is no block of it (copy it into the doc):\n%s", file, s)
			}
		}
	}
	require.Greater(t, programs, 5, "the docs' program blocks were found")
}
