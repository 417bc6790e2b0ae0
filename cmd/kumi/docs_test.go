package main

import (
	"fmt"
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
	mine := []string{"README.md", "docs/design/architecture.md", "docs/guarantees.md", "docs/operations.md", "docs/comparison.md"}
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

// kumiSpan is a `kumi ...` code span; kumiCodeLine a line of a code
// block that runs kumi (after an optional "$ ").
var (
	kumiSpan     = regexp.MustCompile("`(kumi(?: [^`\\n]*)?)`")
	kumiCodeLine = regexp.MustCompile(`^\s*(?:\$ )?(kumi(?: .*)?)$`)
)

// kumiCommands returns the kumi command lines of a Markdown text: its
// code spans outside code blocks and its code blocks' lines. A line whose
// first word after kumi ends with ":" is output (an error kumi printed),
// not a command.
func kumiCommands(md string) []string {
	var out []string
	inCode := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			for _, m := range kumiSpan.FindAllStringSubmatch(line, -1) {
				out = append(out, m[1])
			}
			continue
		}
		if m := kumiCodeLine.FindStringSubmatch(line); m != nil {
			if w := strings.Fields(m[1]); len(w) > 1 && strings.HasSuffix(w[1], ":") {
				continue
			}
			out = append(out, m[1])
		}
	}
	return out
}

// The `kumi ...` commands that README.md and docs/ give name commands
// and flags that exist: a doc may not go on showing what the CLI no
// longer has (issue 28). A word in capitals (COMMAND, SUB) or with a "|"
// (show|reset) stands for a choice, and each choice is checked.
func TestDocsNameOnlyCommandsAndFlagsThatExist(t *testing.T) {
	t.Parallel()
	parser, err := kong.New(&cli{}, kong.Name("kumi"), helpVars())
	require.NoError(t, err)
	files := []string{filepath.Join(repoRoot, "README.md")}
	err = filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return err
	})
	require.NoError(t, err)
	checked := 0
	for _, file := range files {
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, line := range kumiCommands(string(text)) {
			rel, _ := filepath.Rel(repoRoot, file)
			if msg := checkKumiLine(parser.Model.Node, line); msg != "" {
				t.Errorf("%s: `%s`: %s", rel, line, msg)
			}
			checked++
		}
	}
	require.Greater(t, checked, 50, "the docs' kumi commands were not found: is the pattern wrong?")
}

// checkKumiLine checks one command line against the CLI's model and
// returns what is wrong with it, or "".
func checkKumiLine(root *kong.Node, line string) string {
	words := strings.Fields(line)[1:]
	nodes := []*kong.Node{root}
	i := 0
	for ; i < len(words); i++ {
		w := words[i]
		if strings.HasPrefix(w, "-") || strings.ToUpper(w) == w {
			break
		}
		next := nodes[:0:0]
		for _, n := range nodes {
			for _, choice := range strings.Split(w, "|") {
				if c := child(n, choice); c != nil {
					next = append(next, c)
				}
			}
		}
		if len(next) == 0 {
			if len(nodes) == 1 && nodes[0] == root {
				return fmt.Sprintf("no command %q", w)
			}
			break // an argument, or prose after the command
		}
		nodes = next
	}
	for _, w := range words[i:] {
		w = strings.TrimRight(w, ".,;:)")
		if !strings.HasPrefix(w, "-") || w == "-" || w == "--" || strings.HasPrefix(w, "---") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
		name = strings.Trim(name, "[]")
		if name == "" || name == "help" || name == "h" {
			continue
		}
		for _, n := range nodes {
			if !hasFlag(n, name, !strings.HasPrefix(w, "--")) {
				return fmt.Sprintf("command %q has no flag %s", n.Path(), w)
			}
		}
	}
	return ""
}

// child returns n's subcommand called name (or by an alias), or nil.
func child(n *kong.Node, name string) *kong.Node {
	for _, c := range n.Children {
		if c.Type == kong.CommandNode && (c.Name == name || slices.Contains(c.Aliases, name)) {
			return c
		}
	}
	return nil
}

// hasFlag reports whether n or one of its parents has the flag: by its
// long name, or by its one-letter short name when short.
func hasFlag(n *kong.Node, name string, short bool) bool {
	for ; n != nil; n = n.Parent {
		for _, f := range n.Flags {
			if short && len(name) == 1 && f.Short == rune(name[0]) || !short && (f.Name == name || slices.Contains(f.Aliases, name)) {
				return true
			}
		}
	}
	return false
}

// checkKumiLine refuses what does not exist and takes what does.
func TestCheckKumiLine(t *testing.T) {
	t.Parallel()
	parser, err := kong.New(&cli{}, kong.Name("kumi"), helpVars())
	require.NoError(t, err)
	for line, bad := range map[string]bool{
		"kumi status -s SUB --history":            false,
		"kumi checkpoints show|reset":             false,
		"kumi COMMAND --help":                     false,
		"kumi resize -s SUB --buckets M --cancel": false,
		"kumi statuz":                             true,
		"kumi status --histroy":                   true,
		"kumi checkpoints show|rezet --force":     true,
		"kumi dead-letters list -Z":               true,
	} {
		msg := checkKumiLine(parser.Model.Node, line)
		require.Equal(t, bad, msg != "", "%q: %q", line, msg)
	}
}
