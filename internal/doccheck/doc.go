// Package doccheck holds the tests that keep README.md and docs/ true to
// the code: every relative link resolves (its file, and its #anchor to a
// heading there), every test a document cites as evidence exists, and
// every Go name it gives in backquotes (`actors.GroupOptions`,
// `GroupOptions.Buckets`, `leasestore.Store.Pass`) is declared. It has
// no code of its own.
package doccheck
