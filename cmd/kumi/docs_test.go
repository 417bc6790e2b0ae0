package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"
)

// repoRoot is the module root, two levels above this package.
const repoRoot = "../.."

// docs/operations.md documents every command and every flag of the CLI.
func TestOperationsDocCoversTheCLI(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	require.NoError(t, err)
	parser, err := kong.New(&cli{}, kong.Name("kumi"), helpVars())
	require.NoError(t, err)
	var walk func(n *kong.Node, path string)
	walk = func(n *kong.Node, path string) {
		for _, f := range n.Flags {
			if f.Name == "help" {
				continue
			}
			require.True(t, strings.Contains(string(doc), "--"+f.Name), "flag --%s of %q is not in docs/operations.md", f.Name, path)
		}
		for _, c := range n.Children {
			if c.Type != kong.CommandNode {
				continue
			}
			p := strings.TrimSpace(path + " " + c.Name)
			if len(c.Children) == 0 {
				require.True(t, strings.Contains(string(doc), p), "command %q is not in docs/operations.md", p)
			}
			walk(c, p)
		}
	}
	walk(parser.Model.Node, "kumi")
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// The relative links of the README and of the docs this package's authors
// keep point at files that exist, and their anchors at headings.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	mine := []string{"README.md", "docs/architecture.md", "docs/guarantees.md", "docs/operations.md", "docs/comparison.md"}
	for _, name := range mine {
		text, err := os.ReadFile(filepath.Join(repoRoot, name))
		require.NoError(t, err)
		for _, m := range mdLink.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := filepath.Join(repoRoot, filepath.Dir(name), file)
			if file == "" {
				path = filepath.Join(repoRoot, name)
			}
			body, err := os.ReadFile(path)
			if err != nil {
				rel, _ := filepath.Rel(repoRoot, path)
				if slices.Contains(mine, rel) {
					t.Errorf("%s links to %s, which does not exist", name, target)
				} else {
					t.Logf("%s links to %s, not written yet", name, target)
				}
				continue
			}
			if anchor != "" {
				require.True(t, headingAnchors(string(body))[anchor], "%s links to %s: no such heading", name, target)
			}
		}
	}
}

// headingAnchors returns the GitHub anchors of a Markdown file's headings.
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 0x7f:
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}

// The package documentation's command list names every command: it left
// out console (issue 15).
func TestPackageDocListsEveryCommand(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	listed := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if rest, ok := strings.CutPrefix(line, "//\t"); ok && rest != "" && !strings.HasPrefix(rest, "kumi ") {
			listed[strings.Fields(rest)[0]] = true
		}
	}
	parser, err := kong.New(&cli{}, kong.Name("kumi"), helpVars())
	require.NoError(t, err)
	for _, c := range parser.Model.Node.Children {
		if c.Type == kong.CommandNode {
			require.True(t, listed[c.Name], "command %q is not in doc.go's list (listed: %v)", c.Name, listed)
		}
	}
}
