// Package doccheck holds the tests that keep README.md and docs/ true to
// the code:
//
//   - every relative link resolves (its file, and its #anchor to a
//     heading there);
//   - every test a document cites as evidence exists;
//   - every Go name it gives in backquotes (`actors.GroupOptions`,
//     `GroupOptions.Buckets`, `leasestore.Store.Pass`) is declared;
//   - every `make TARGET` it shows is a rule of the Makefile, whose .PHONY
//     list and rules agree;
//   - every demo flag it shows is one cmd/demo defines;
//   - every KUMI_* environment variable it names is spelled in the code.
//
// The `kumi` commands and flags the docs show are checked against the CLI
// by cmd/kumi's own tests. It has no code of its own.
package doccheck
