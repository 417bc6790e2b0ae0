package goname

import (
	"go/parser"
	"testing"
)

func TestOf(t *testing.T) {
	for src, want := range map[string]string{
		"T": "T", "*T": "T", "T[int]": "T", "*T[int, string]": "T", "pkg.T": "", "[]T": "", "struct{}": "",
	} {
		e, err := parser.ParseExpr(src)
		if err != nil {
			t.Fatal(err)
		}
		if got := Of(e); got != want {
			t.Errorf("Of(%s) = %q, want %q", src, got, want)
		}
	}
}
