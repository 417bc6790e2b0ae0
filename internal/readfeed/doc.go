// Package readfeed is a bucket reader's read side as a pure, synchronous
// state machine: no goroutines, no clock, no database. It decides where
// the reader reads its bucket from and through, when it follows the
// publisher's live batches and when it holds them back, and it keeps the
// events read but not yet taken by the delivery window (the pending
// list). The reader actor (actors/reader.go) feeds it inputs — its
// checkpoint loaded, a page read, a live batch, the position its
// subscription starts at, a pause of its live queue, a resize bound — and
// carries out the [Effects] it returns: read a page, hold or release the
// live queue, resume it. Its window takes events with [Feed.Take].
//
// # Phases
//
// One [Phase] holds what the read side is doing: [Loading] until the
// checkpoint is loaded (nothing is read: a read from the cursor's zero
// value would queue events the checkpoint covers); [CatchingUp], reading
// pages from the store until they cover a target position, with at most
// one page read out ([Feed.Reading]); [Live], taking the publisher's
// batches. Whether the live queue is held follows from the phase and the
// pending list ([Feed.Held]): held while catching up, so that no live
// batch overtakes the catch-up, and while a batch's worth of events is
// pending.
//
// # Identity
//
// Every read names itself ([Read.ID]); a page answers one read by its id
// ([Page.Read]). An answer of a read the feed no longer waits for — one
// given up and read again ([Feed.ReadAgain]) — is recognised by what it
// is, whatever the order it arrives in, and changes nothing. What a read
// was for (its target, the queue's resumes when it started) stays with
// the feed, not in the answer.
//
// # The simulation
//
// sim_test.go runs the feed against a simulated bucket, publisher, live
// queue and lagging standby under a seeded scheduler, and checks after
// every step that no event is skipped or queued twice; TestSimFindsTheFaults
// re-injects the read-side bugs fixed in the past, one at a time, and
// requires each found (docs/design/architecture.md, "The read side").
package readfeed
