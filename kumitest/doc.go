// Package kumitest tests a kumi handler the way kumi delivers to it, and
// under the faults kumi's guarantees allow.
//
// # Given, when, then
//
// A [Kit] runs one handler — the props a group's GroupOptions.Handler
// would get: [actors.Func], [actors.Typed], an [actors.Router], an
// [actors.BatchFunc] or an actor of your own — through the real handler
// path: spawned in an in-process protoactor actor system with kumi's
// middleware (a panic is a retry), sent real *actors.Delivery (or
// *actors.Batch) messages, its replies read by the function a group's
// reader reads them with, and the group's [actors.RetryPolicy] applied on
// a simulated clock: no worker pool, no leases, no sleeps. Give it events
// ([Event]: a stream, a type, data; versions and positions follow the
// order given) and assert on the [Result]: each event's [Outcome] (acked,
// committed, dead-lettered with its reason, after how many attempts), the
// deliveries made, and the handler's own effects. A hundred events run in
// milliseconds.
//
// With [Options.Store], the events are appended to a real event store and
// the kit holds a real lease for each bucket, so that a handler writing
// through [actors.CommitWithCheckpoint] commits for real, fenced.
//
// # Faults
//
// [Kit.Check] runs the events once cleanly and then under each fault
// schedule ([Fault]): a crash that redelivers the tail after the last
// checkpoint, duplicates at random points, a retry after a timeout while
// the first attempt still runs, a handoff in the middle of a stream, a
// resize cut, and batches split at random sizes. Each schedule is drawn
// from a seed. It compares the handler's effects after each with those of
// the clean pass; the first that differ come back as a *[FaultError]
// naming the schedule and the seed, which [CheckOptions] replays.
// docs/testing.md says more.
package kumitest
