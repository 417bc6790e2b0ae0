// Package integration holds kumi's fault, chaos and scale tests: real
// worker processes (./workerbin, internal/worker's complete worker) on a
// real PostgreSQL (internal/pgtest), real faults, and an observer that
// judges the run from the database alone. It has no code outside its
// tests; this file documents them.
//
// # The harness
//
// TestMain builds the worker binary once (with the race detector when the
// tests have it). Each scenario takes a fresh schema, installs the
// observer's triggers in it, and starts a cluster: one slot per worker,
// each slot a sequence of incarnations with fresh worker ids ("w1.1",
// "w1.2", …) that the harness can kill -9, freeze and thaw (SIGSTOP,
// SIGCONT), stop gracefully (SIGTERM), or cut off from the database
// through a TCP proxy of its own (blackhole: bytes vanish while both ends
// stay connected; drop: connections closed, new ones refused). Appender
// goroutines, with a pool and a sequencer of their own, append a steady
// load meanwhile.
//
// # The observer
//
// Triggers log, inside the writers' own transactions, every change of a
// bucket's owner (with the previous owner's expiry, the taker's now() and
// whether the taker holds the previous owner's session lock), every other
// change of a two-phase claim, every pass (worker heartbeat, with the
// snapshot it saw), every checkpoint write, every delivery the
// workers' sink records and every dead-lettering, by whose session
// (application_name is the worker id); and, for resizes (docs/design/resize.md), every old bucket's drain and
// every change of the subscription's generation and state. Lease rows and
// checkpoints are keyed by slot (generation·65536 + bucket), so the logs
// tell the generations apart. A poller reads the lease and checkpoint tables every 20 ms, and the
// harness reads each worker's /metrics directly (never through its proxy)
// to see when it starts deliveries. From these a scenario computes
//
//   - lost: committed events of the category with no sink row (but for
//     those a scenario expects dead-lettered, which it checks itself:
//     TestPoisonEvent's unreadable event);
//   - duplicates: the sink's deliveries beyond the first;
//   - regressions: checkpoint writes that moved a checkpoint back;
//   - overlaps: leases taken while still valid by the database's clock,
//     without the owner's consent or liveness evidence;
//   - stale deliveries and checkpoints: writes that landed from a worker
//     that did not own the bucket at that moment (an event's bucket is
//     its slot in the generation whose positions hold it);
//   - order: first deliveries of a stream out of version order;
//   - skipped writes: checkpoint writes by a worker that moved a slot's
//     checkpoint over an event of the slot that nobody had delivered or
//     dead-lettered at that moment — a skip, whether the event is then
//     lost or delivered late by someone else (skipped_test.go, which also
//     shows the count catching a forced skip);
//   - for a resize (resize_test.go): cross (an old generation's event
//     first delivered after its old bucket drained, or a drain off the
//     cut), early (a new generation's event delivered before the old
//     buckets feeding its new bucket drained), duplicates that no fault
//     excuses (first delivered by a killed worker, delivered by a frozen
//     one, or redelivered after the first deliverer lost the bucket
//     without consent), and the times from the request to the
//     cut, the switch, the first new delivery and completion, and the
//     pause deliveries saw;
//   - failover (per fault: until every bucket of the worker had another
//     owner) and convergence (per join: until a fair split including it);
//   - unowned time, and passes a bucket's next owner began, while the
//     bucket was free for it, without claiming it.
//
// and prints one "SUMMARY …" line.
//
// # Forms
//
// Every scenario runs in CI in a short form of seconds. KUMI_CHAOS=long
// (make chaos) runs the long form, about a minute each; its summary lines
// are in docs/benchmarks.md. KUMI_CHAOS_LOGS=dir keeps the workers' logs.
// Assertions are on invariants, never on durations.
package integration
