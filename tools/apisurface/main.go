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
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
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
	out := map[string]int{}
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
				out[filepath.ToSlash(rel)] += exported(f)
			}
		}
		return nil
	})
	return out, err
}

// exported counts a file's exported identifiers.
func exported(f *ast.File) int {
	n := 0
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil || exportedRecv(d.Recv) {
				n++
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, id := range s.Names {
						if id.IsExported() {
							n++
						}
					}
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						n += 1 + members(s.Type)
					}
				}
			}
		}
	}
	return n
}

// members counts the exported fields of a struct and the methods of an
// interface.
func members(t ast.Expr) int {
	var fields *ast.FieldList
	switch t := t.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		return 0
	}
	n := 0
	for _, f := range fields.List {
		for _, id := range f.Names {
			if id.IsExported() {
				n++
			}
		}
	}
	return n
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(r *ast.FieldList) bool {
	return len(r.List) > 0 && ast.IsExported(goname.Of(r.List[0].Type))
}
