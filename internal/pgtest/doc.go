// Package pgtest runs a throwaway PostgreSQL for tests and benchmarks, and
// gives each test a fresh schema of its own.
//
// # The server
//
// The server itself is [pgserver]'s (the demo embeds it too); [Start],
// [Server], [Options], [FindBinaries] and [FreePort] are its, here for
// tests that need a server of their own.
//
// # In tests
//
// Call [Main] from a package's TestMain: it starts one server per test binary
// (or uses DATABASE_URL when set), runs the tests, checks for leaked
// goroutines with goleak and stops the server. [NewSchema] then gives a test
// a fresh schema name, dropped when the test ends, so tests run in parallel
// without sharing rows. [Eventually] polls a condition with a deadline, for
// tests that must wait on something asynchronous without sleeping blindly.
package pgtest
