package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/kumi-run/kumi/internal/goname"
)

// root is the module's root, from this package's directory.
const root = "../.."

// documents returns README.md, CHANGELOG.md (when there is one) and
// every Markdown file under docs/, relative to root.
func documents(t *testing.T) []string {
	t.Helper()
	docs := []string{"README.md"}
	if _, err := os.Stat(filepath.Join(root, "CHANGELOG.md")); err == nil {
		docs = append(docs, "CHANGELOG.md")
	}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			docs = append(docs, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	fence   = regexp.MustCompile("(?s)```.*?```")
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	quoted  = regexp.MustCompile("`([^`\n]+)`")
)

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
		a := slug(m[1])
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// slug is GitHub's anchor for a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces made hyphens.
func slug(h string) string {
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1") // a link: its text
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestLinksResolve: every relative link of the docs names a file that
// exists, and its #anchor a heading of that file.
func TestLinksResolve(t *testing.T) {
	for _, doc := range documents(t) {
		text := read(t, doc)
		for _, m := range link.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(filepath.Dir(doc), file)
				if _, err := os.Stat(filepath.Join(root, path)); err != nil {
					t.Errorf("%s: link %q: no file %s", doc, target, path)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if !anchors(read(t, path))[anchor] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", doc, target, path, anchor)
			}
		}
	}
}

// decls is what the module declares: per package name, its top-level
// names; per type name (of any package), its fields and methods; and the
// names of every test, benchmark, example and fuzz target.
type decls struct {
	pkgs    map[string]map[string]bool
	members map[string]map[string]bool
	fields  map[string][]string // a field's name: the names of its types
	tests   []string
}

// hasMember reports whether X.m names a field or method: of the type X,
// or of the type of a field named X (`Batch.MaxEvents` for
// GroupOptions.Batch, a BatchOptions). An X that is neither is not
// judged.
func (d decls) hasMember(x, m string) bool {
	ms, isType := d.members[x]
	if isType && ms[m] {
		return true
	}
	for _, typ := range d.fields[x] {
		if d.members[typ][m] {
			return true
		}
	}
	return !isType && len(d.fields[x]) == 0
}

func declared(t *testing.T) decls {
	t.Helper()
	d := decls{pkgs: map[string]map[string]bool{}, members: map[string]map[string]bool{}, fields: map[string][]string{}}
	member := func(typ, name string) {
		if d.members[typ] == nil {
			d.members[typ] = map[string]bool{}
		}
		d.members[typ][name] = true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if n := e.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := filepath.Base(filepath.Dir(p))
		if d.pkgs[pkg] == nil {
			d.pkgs[pkg] = map[string]bool{}
		}
		test := strings.HasSuffix(p, "_test.go")
		for _, decl := range f.Decls {
			switch x := decl.(type) {
			case *ast.FuncDecl:
				name := x.Name.Name
				if x.Recv != nil {
					member(goname.Of(x.Recv.List[0].Type), name)
					continue
				}
				if test {
					for _, pre := range []string{"Test", "Benchmark", "Example", "Fuzz"} {
						if strings.HasPrefix(name, pre) {
							d.tests = append(d.tests, name)
						}
					}
				}
				d.pkgs[pkg][name] = true
			case *ast.GenDecl:
				for _, s := range x.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, id := range s.Names {
							d.pkgs[pkg][id.Name] = true
						}
					case *ast.TypeSpec:
						d.pkgs[pkg][s.Name.Name] = true
						fieldsOf(s.Type, func(n, typ string) {
							member(s.Name.Name, n)
							if typ != "" {
								d.fields[n] = append(d.fields[n], typ)
							}
						})
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(d.tests)
	return d
}

// fieldsOf calls add with the name of each field of a struct (and the
// name of its type, when it is a named one) or method of an interface.
func fieldsOf(e ast.Expr, add func(name, typ string)) {
	var list *ast.FieldList
	switch x := e.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list = x.Methods
	default:
		return
	}
	for _, f := range list.List {
		typ := goname.Of(f.Type)
		if sel, ok := f.Type.(*ast.SelectorExpr); ok {
			typ = sel.Sel.Name
		}
		for _, id := range f.Names {
			add(id.Name, typ)
		}
		if len(f.Names) == 0 { // embedded: its name is its type's
			add(typ, typ)
		}
	}
}

// testName matches what the docs cite as a test: TestX, TestX/Sub, or a
// -run pattern's alternatives.
var testName = regexp.MustCompile(`\b((?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*)`)

// TestCitedTestsExist: every test the docs cite (as evidence for a
// guarantee, or in a command) is a test, benchmark or fuzz target of the
// module, or the prefix of one (a -run pattern).
func TestCitedTestsExist(t *testing.T) {
	d := declared(t)
	exists := func(name string) bool {
		i := sort.SearchStrings(d.tests, name)
		return i < len(d.tests) && strings.HasPrefix(d.tests[i], name)
	}
	for _, doc := range documents(t) {
		for _, q := range quoted.FindAllStringSubmatch(read(t, doc), -1) {
			for _, m := range testName.FindAllStringSubmatch(q[1], -1) {
				if !exists(m[1]) {
					t.Errorf("%s: cites %s, which no test of the module is named (or begins with)", doc, m[1])
				}
			}
		}
	}
}

// goName matches a backquoted Go name: pkg.Name, pkg.Type.Member,
// Type.Member, with an optional () or {…}.
var goName = regexp.MustCompile(`^(?:([a-z][a-z0-9]*)\.)?([A-Z][A-Za-z0-9_]*)(?:\.([A-Za-z][A-Za-z0-9_]*))?(?:\(.*\)|\{.*\})?$`)

// TestGoNamesExist: every Go name the docs give in backquotes, of one of
// kumi's packages (pkg.Name, pkg.Type.Member) or of one of its types
// (Type.Member), is declared.
func TestGoNamesExist(t *testing.T) {
	d := declared(t)
	for _, doc := range documents(t) {
		for _, q := range quoted.FindAllStringSubmatch(read(t, doc), -1) {
			m := goName.FindStringSubmatch(strings.TrimSpace(q[1]))
			if m == nil {
				continue
			}
			pkg, name, mem := m[1], m[2], m[3]
			switch {
			case pkg != "":
				names, ok := d.pkgs[pkg]
				if !ok {
					continue // another module's package: pgx.Tx, http.Handler
				}
				if !names[name] {
					t.Errorf("%s: `%s`: package %s declares no %s", doc, q[1], pkg, name)
				} else if mem != "" && !d.hasMember(name, mem) {
					t.Errorf("%s: `%s`: %s.%s has no field or method %s", doc, q[1], pkg, name, mem)
				}
			case mem != "":
				if !d.hasMember(name, mem) {
					t.Errorf("%s: `%s`: type %s has no field or method %s", doc, q[1], name, mem)
				}
			}
		}
	}
}
