// Package leasestore divides a subscription's N buckets among a pool of
// identical workers through leases kept in PostgreSQL, with no external
// coordinator. It is the ownership half of kumi: the actor runtime's
// Coordinator runs [Store.Pass] every heartbeat and starts or stops one
// bucket reader per owned bucket from the [PassResult]; the event store's
// fenced checkpoint writes call the [eventsource.Fence] of [Store.Fence].
//
// # Tables
//
// [Migrate] creates the tables in the configured schema: lease_buckets, one
// row per (subscription, slot) with the owner, the epoch, the expiry, the
// heartbeat, its generation's bucket count and the pending two-phase claim;
// lease_workers, one row per (subscription, worker) with its heartbeat and
// expiry (and, for [KindSession], its session's advisory lock key); and
// subscriptions and generations, a subscription's serving generation and a
// resize in progress. Every time in them is the database's now(): expiry
// is judged by one clock, so two workers' clock skew cannot make both
// believe they hold a bucket.
//
// # The pool of workers and the fair share
//
// [New] joins the pool at once, so every worker — one that owns nothing
// included — is counted, and the fair share [FairShare](N, live) is known on
// the first pass: k workers started together split N buckets in one pass.
//
// # A pass
//
// [Store.Pass] is one transaction: heartbeat the worker row; renew the held
// buckets (monotonically: GREATEST, so a delayed renewal never moves a lease
// back) and reconfirm them — a bucket another worker has claimed is not
// extended and is reported in [PassResult.HandOff]; activate this worker's
// claims whose owner handed over; claim free or expired buckets (FOR UPDATE
// SKIP LOCKED) up to the fair share; withdraw claims above it; and, still
// below it, place two-phase claims on live owners' surplus. A pass is
// bounded by the heartbeat; on any error it changes nothing and the
// previous view stands. The stores of one process may share a
// [PassBatcher] (Config.Batcher): their steady passes then go to the
// database in one round trip, each still its own transaction.
//
// # The handoff
//
// Taking a bucket from a live owner is cooperative (the smithers protocol):
// the claimant places a claim; the owner's next reconfirm fails, so it stops
// the bucket's reader, flushes its checkpoint and calls [Store.HandOver];
// the claimant, woken by a notification, activates the claim on its next
// pass, and the epoch grows. A claim whose claimant is no longer a live
// worker (or is older than 2×TTL) is stale and is recovered. A bucket moves
// without its owner's consent only with liveness evidence: its lease has
// expired by the database's clock, or — [KindSession] — the owner's session
// advisory lock is free, proven inside the taking transaction by taking
// that lock.
//
// # Fencing
//
// Every change of owner increments the bucket's epoch, and so does
// [FenceOut], an operator's fence (a checkpoint reset) that no earlier
// holder may undo. [Store.Guard] (and
// the fence of [Store.Fence]) locks the lease row FOR SHARE inside the
// writer's transaction and checks owner and epoch, so a zombie whose bucket
// moved writes nothing and gets a [LostFenceError] wrapping
// [eventsource.ErrFenceLost].
//
// # Lease kinds
//
// [KindRow] needs nothing but ordinary short statements and works through a
// transaction pooler. [Store.EnsureHeld] fails once the last renewal that
// landed started TTL−Margin ago by the worker's own clock (monotonic, and
// on Linux CLOCK_BOOTTIME, which counts a suspended host's sleep), so an
// action it lets through that completes within Margin lands before any rival
// can hold the lease. With the defaults (TTL 30s, heartbeat TTL/5, margin
// TTL/3) it rides out one failed or hung renewal. [KindSession] adds a
// session advisory lock on a dedicated connection: a crashed worker's
// buckets move on the next pass of any other worker instead of after a TTL.
// Its leases still expire, so a hung process with a live session loses them
// too, and its EnsureHeld also asks the session.
//
// # Notifications
//
// Claims, handoffs, releases, joins and leaves NOTIFY a channel per schema
// and subscription; [Store.Changes] wakes the coordinator at once. The
// store listens through an eventsource.Notifier: Config.Notifier, the
// process's one LISTEN connection (the actors runtime passes its own), or
// one of its own when none is given. Polling every heartbeat remains the
// correctness fallback.
//
// # Resizes
//
// A subscription's bucket count changes online by generations
// (docs/design/resize.md). [RequestResize] adds generation g+1 with M buckets
// beside the serving generation g; the holders of g's buckets propose
// bounds ([Store.ProposeCut]), the last proposal decides the cut C, each
// old bucket drains to C ([Store.DrainTx]), and new bucket j starts
// ([Lease.Ready]) once its [Feeders] have drained. A bucket's lease row and
// checkpoint are keyed by its slot, eventsource.Slot(generation, bucket):
// for a subscription never resized, the bucket itself. Config.Buckets is
// the count a subscription is created with; afterwards the database's
// rules ([Store.Serving]). Workers of a version before resizes are fenced
// out of a subscription that resizes (SQLSTATE KU001).
//
// docs/design/leases.md has the state diagram, the margin arithmetic and the
// benchmark figures.
package leasestore
