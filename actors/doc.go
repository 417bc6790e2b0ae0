// Package actors is kumi's runtime: the actors that turn leased buckets
// into running, supervised readers of a category, and the front door a
// service calls.
//
// # Using it
//
// The shortest path is [Run]: given an [eventsource.Store] and a
// [GroupOptions] per subscription, it starts a [Runtime] and a [Group] for
// each, runs them until its context ends (signal.NotifyContext), and then
// stops them gracefully within a bounded time. Every process that runs the
// same subscription shares its buckets: start the binary N times and the
// workers divide the buckets among themselves through leases in PostgreSQL.
//
// For more control, make one [Runtime] per process with [New] and start it, on
// your own protoactor [actor.ActorSystem], and a [Group] per subscription
// with [Runtime.StartGroup]. [Group.Stop] is graceful: readers finish their
// in-flight event, flush their checkpoints and release their leases, so the
// others take over at once. The runtime, its groups and its publisher
// follow kumi's one lifecycle contract (docs/design/architecture.md, "Lifecycle"):
// [New] and [Runtime.NewGroup] make them, Start starts them (its context
// bounds the start only), and Stop, idempotent and final, stops them.
//
// # Handlers
//
// A group's Handler is the props of an actor. [Func] makes one from a
// function, func(ctx, *Delivery) error ([HandlerFunc]): nil acks, an error
// retries, a [Permanent] error dead-letters at once, a panic is a retry
// that says where it panicked. [Typed] makes one that decodes the event's
// JSON data into a Go type first ([TypedFunc] is that function, to compose),
// [BatchFunc] one that takes batches, and a [Router] calls a function per
// event type ([On], [Router.Props]); data that does not decode is
// dead-lettered at once with a [*DecodeError].
//
// An actor of your own receives a [*Delivery] for each event of the buckets
// this worker owns — one event at a time per bucket, so per-stream order
// holds — and answers with ctx.Respond: [Ack], [Retry] (after a delay, within
// the group's [RetryPolicy]) or [DeadLetter]. A panic or no answer within
// HandlerTimeout counts as a retry; when the retry budget is spent the event
// goes to the dead-letter table and the bucket moves on. A handler whose
// writes go to the same database can make them exactly-once with
// [CommitWithCheckpoint]; a function handler returns its error.
//
// Batches are opt-in (GroupOptions.Batch): the handler then receives a
// [*Batch] of a bucket's next events and answers once with a [BatchAck];
// [BatchFunc] makes one from func(ctx, *Batch) error, where [DoneUpTo]
// says how far it got, and [CommitBatchWithCheckpoint] makes a batch's
// writes exactly-once.
//
// # The actors
//
//   - The Publisher (one per Runtime) reads new events once per notification
//     (plus a safety poll) and posts each reader the batch of its bucket's
//     events through the reader's bounded queue, whose overflow policy
//     (internal/overflow) never blocks the publisher. Each batch names the
//     range of positions it covers, so a reader that lost batches to an
//     overflow sees the gap and re-reads it from the database: no policy
//     loses an event for a group.
//   - The Coordinator (one per Group) runs a reconcile pass every lease
//     heartbeat, and at once on a rebalance notification: worker
//     heartbeat, renew, claim up to the fair share, cooperative handoff of
//     surplus (leasestore). It spawns a BucketReader for each newly owned
//     bucket, stops the reader of each lost one, and drains a reader before
//     handing its bucket over. Its database calls run off its mailbox.
//   - A BucketReader (one per owned bucket, child of the Coordinator) loads
//     its fenced checkpoint, catches up through SQL, then follows the
//     publisher; it delivers to its own Handler child and moves the
//     checkpoint after acks in batches, fenced by its lease epoch. A lost
//     fence, or a row lease it can no longer be sure of, stops it at once.
//
// Failures are supervised (package supervision): a transient database error
// restarts a reader with exponential backoff; a lost fence stops it; invalid
// configuration escalates.
package actors
