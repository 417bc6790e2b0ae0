// Package inspect is what kumi's operator tools share: a read-only view of
// a subscription ([Inspect], [Subscriptions], [Known]) and of a resize in
// progress, built from leasestore's and eventsource's operator reads
// without joining the pool as a worker. Connecting without repeating a
// password is internal/dburl's; printing what the database holds so that a
// terminal shows it rather than acts on it is internal/termsafe's.
//
// It is used by the CLI (cmd/kumi), the console and the demo's screen. It
// does not depend on the runtime (package actors) nor on the exporters:
// the operator's CLI stays small.
package inspect
