// Package goname reads names out of Go syntax trees, for the tools and
// tests that look at kumi's own source (tools/apisurface,
// internal/doccheck).
package goname

import "go/ast"

// Of returns the name of a type expression: T for T, *T, T[A] and
// *T[A, B]; "" for anything else (a literal type, a qualified name).
func Of(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
