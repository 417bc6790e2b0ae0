// Package inspect is what kumi's operator tools share: a read-only view of
// a subscription ([Inspect], [Subscriptions], [Known]), built from
// leasestore's and eventsource's operator reads without joining the pool
// as a worker; connecting from a connection string without ever repeating
// its password ([ConnectPool], [ParseURL], [RedactURL]). Printing what the
// database holds so that a terminal shows it rather than acts on it is
// internal/termsafe's.
//
// It is used by the CLI (cmd/kumi), the console and the demo's screen. It
// does not depend on the runtime (package actors) nor on the exporters:
// the operator's CLI stays small.
package inspect
