// Package overflow is the bounded, overflow-aware queue between kumi's
// Publisher and each BucketReader, and the protoactor mailbox built on it.
//
// The Publisher reads new events once and posts them, as batches, to every
// reader. A slow reader must neither block the Publisher nor grow without
// bound, so each reader's mailbox bounds the batches it holds — in number
// ([Config.Capacity]), in bytes ([Config.MaxBytes], counted by [Sized]),
// and against a byte [Budget] shared by every queue of the process
// ([Config.Budget]) — and applies the reader's [Policy] when a batch finds
// it full, whichever bound it crosses — as the batch is posted, under one
// short lock, never blocking or spinning. Everything else
// a reader receives (handler acks, timers, control messages, PoisonPill)
// passes unbounded, and system messages keep their own unbounded queue, so
// a reader with a full queue can still be stopped at once.
//
// # Policies
//
//   - [PauseAndResume] (the default, lossless): the queue enters [Paused],
//     discards the batches it holds and refuses batches until the reader
//     calls [Queue.Resume]. The reader re-reads what it missed from the
//     store.
//   - [DropSubscription]: the queue enters [Overflowed] for good and the
//     reader ends its subscription with the [*OverflowError] (which wraps
//     [ErrOverflowed]).
//   - [DropOldest]: the oldest queued batches are evicted to make room;
//     lossy, counted in [Stats.Evicted] and reported, one by one, to
//     [Config.OnTransition]. If the shared budget has no room even once
//     the queue is empty, it pauses as under PauseAndResume.
//
// # Bytes
//
// A queue that holds no batch takes one of any size (its MaxBytes bounds
// what waits behind the batch at its head), so a queue holds at most
// MaxBytes plus one batch. The shared budget makes no such exception: the
// queues under one budget hold at most its limit together. A batch's bytes
// are charged when it is queued and given back when it leaves: delivered,
// evicted, discarded on a pause or overflow, or dropped by [Queue.Close],
// which a consumer that stops for good calls so that batches posted to a
// queue nobody reads do not hold the budget.
//
// A [Batch] is any message with an OverflowBatch method (or whatever
// [Config.IsBatch] says), judged inside a protoactor envelope.
//
// # Signals
//
// A reader learns of a state change from its own mailbox, in order with its
// other messages: a [*PausedSignal] when the queue pauses, an
// [*OverflowedSignal] when it overflows. [Queue.State], [Queue.Err] and
// [Queue.Stats] answer the same questions at any time.
//
// # The reader's protocol
//
// Events are appended to the store before the Publisher posts them. So
// after [Queue.Resume] returns, every batch the queue refused holds only
// events that a store read starting now will see, and every later batch is
// queued. A reader therefore never loses an event if, on a [*PausedSignal]
// (and likewise when it starts):
//
//  1. it calls [Queue.Hold], so that live batches wait for the catch-up
//     instead of overtaking it (they stay bounded: if they fill the queue,
//     it pauses again and the reader starts over);
//  2. it calls [Queue.Resume];
//  3. at once, it reads the store from the position of the last event it
//     delivered up to the tail (reads may run outside the actor and come
//     back as ordinary messages: those are not held). Only a read that
//     started after the Resume counts: a catch-up already under way reads
//     on. It must not wait for a later batch to reveal the gap: the dropped
//     batches may have been the last of a burst, and then no later batch
//     comes until the next append;
//  4. it calls [Queue.Release] and, for the batches that follow, skips
//     events at or below the last position it delivered.
//
// Under [DropOldest] no signal comes (except the pause of an empty queue
// over the shared budget, handled as above), but an eviction is always caused by
// a newer batch, which is queued: the reader sees the gap between that
// batch's range and its own position, and re-reads it. Under
// [DropSubscription] the reader finishes what it has in flight and ends
// its subscription with the [*OverflowError]; the queue stays [Overflowed]
// for good, so whoever reads the bucket next needs a new queue.
//
// A queue can be held before its actor is spawned, which closes the same
// race for a reader's first catch-up: hold, subscribe to the Publisher,
// spawn, catch up, release.
//
// # The mailbox
//
// [Queue.Mailbox] returns an [actor.MailboxProducer] for one actor:
//
//	q, err := overflow.New(overflow.Config{Capacity: 64, Policy: overflow.PauseAndResume})
//	props := actor.PropsFromProducer(newReader(q), actor.WithMailbox(q.Mailbox()))
//
// It schedules like protoactor's default mailbox (system messages first,
// suspension while a failed actor awaits its supervisor, the dispatcher's
// throughput), but it never blocks a poster, as protoactor's Bounded does,
// and it goes idle as soon as nothing is deliverable — a refused or held
// batch schedules no work — where BoundedDropping spins a core for ever
// after its first drop. The queue lives as long as the actor: it survives
// restarts, so a restarted reader calls [Queue.Resume] on Started, which
// clears a pause its predecessor left and returns the [*OverflowError] of
// an overflowed queue — the reader must then end at once, as its
// predecessor was about to: it would otherwise catch up once and never
// receive another batch.
//
// # Observability
//
// [Queue.Stats] is a consistent snapshot — state, depth, and counters of
// batches posted, delivered and dropped, of evictions, pauses, resumes and
// overflows — for gauges and counters. [Config.OnTransition] is called on
// every state change, in order, for logs, traces or event counters.
package overflow
