package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCountsWhatAUserCanName(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n")
	write("pub/pub.go", `package pub

const A, b = 1, 2 // A
var V int         // V
type T struct {   // T, X
	X, y int
}
type t struct{ Z int }
type I interface{ M(); n() } // I, M
func F() {}                 // F
func (T) Method() {}        // Method
func (t) Hidden() {}
func f() {}
`)
	write("pub/pub_test.go", "package pub\n\nfunc Exported() {}\n")
	write("internal/x/x.go", "package x\n\nfunc Skipped() {}\n")
	write("cmd/c/main.go", "package main\n\nfunc Skipped() {}\n")
	got, err := count(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["pub"] != 8 {
		t.Fatalf("count = %v, want map[pub:8]", got)
	}
	names, err := list(root)
	if err != nil {
		t.Fatal(err)
	}
	if want := "A F I I.M T T.Method T.X V"; strings.Join(names["pub"], " ") != want {
		t.Fatalf("list = %v, want %s", names["pub"], want)
	}
}
