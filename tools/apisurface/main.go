package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kumi-run/kumi/internal/goname"
)

func main() {
	max := flag.Int("max", 0, "fail when the total is above this (0: only print)")
	pkg := flag.String("list", "", "print the exported identifiers of this package (a directory such as eventsource), one a line, and exit")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	if *pkg != "" {
		names, err := list(root)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apisurface:", err)
			os.Exit(2)
		}
		for _, n := range names[filepath.ToSlash(filepath.Clean(*pkg))] {
			fmt.Println(n)
		}
		return
	}
	counts, err := count(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apisurface:", err)
		os.Exit(2)
	}
	dirs := make([]string, 0, len(counts))
	total := 0
	for d, n := range counts {
		dirs = append(dirs, d)
		total += n
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		fmt.Printf("%-28s %4d\n", d, counts[d])
	}
	fmt.Printf("%-28s %4d exported identifiers\n", "total", total)
	if *max > 0 && total > *max {
		fmt.Fprintf(os.Stderr, "apisurface: %d exported identifiers, above the limit of %d\n", total, *max)
		os.Exit(1)
	}
}

// private reports whether a directory, relative to the module's root,
// holds no public package.
func private(rel string) bool {
	first := strings.Split(filepath.ToSlash(rel), "/")[0]
	switch first {
	case "internal", "cmd", "examples", "test", "tools", "testdata":
		return true
	}
	return strings.Contains(filepath.ToSlash(rel), "/internal/") || strings.HasPrefix(first, ".")
}

// count returns the exported identifiers of each public package under root.
func count(root string) (map[string]int, error) {
	names, err := list(root)
	out := map[string]int{}
	for d, n := range names {
		out[d] = len(n)
	}
	return out, err
}

// list returns the exported identifiers of each public package under root,
// sorted.
func list(root string) (map[string][]string, error) {
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if rel != "." && private(rel) {
			return filepath.SkipDir
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(path, name), nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if f.Name.Name != "main" {
				out[filepath.ToSlash(rel)] = append(out[filepath.ToSlash(rel)], exported(f)...)
			}
		}
		return nil
	})
	for _, n := range out {
		sort.Strings(n)
	}
	return out, err
}

// exported returns a file's exported identifiers: Name, Type.Method and
// Type.Field.
func exported(f *ast.File) []string {
	var names []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				names = append(names, d.Name.Name)
			} else if recv := goname.Of(d.Recv.List[0].Type); ast.IsExported(recv) {
				names = append(names, recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, id := range s.Names {
						if id.IsExported() {
							names = append(names, id.Name)
						}
					}
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						names = append(names, s.Name.Name)
						for _, m := range members(s.Type) {
							names = append(names, s.Name.Name+"."+m)
						}
					}
				}
			}
		}
	}
	return names
}

// members returns the exported fields of a struct and the methods of an
// interface.
func members(t ast.Expr) []string {
	var fields *ast.FieldList
	switch t := t.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		return nil
	}
	var names []string
	for _, f := range fields.List {
		for _, id := range f.Names {
			if id.IsExported() {
				names = append(names, id.Name)
			}
		}
	}
	return names
}
