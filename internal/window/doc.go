// Package window is a bucket reader's delivery window as a pure,
// deterministic state machine: no actor, no clock, no I/O — time comes in
// with the inputs, and what is to be done goes out as [Effects]. It keeps
// the rules actors/deliver.go threads by hand through the reader:
//
//   - admission: at most MaxInFlight slots, in position order
//     ([State.Take], [State.Room]); a slot is sent only when no earlier
//     slot of its stream is unfinished, so MaxInFlight 1 delivers
//     strictly one event at a time;
//   - a lease check before every send, a retry's as a first one's: the
//     window asks for one ([Effects.CheckLease]) and sends only on its
//     answer ([State.Lease]); a lease found unsure drains the window and
//     nothing more is sent;
//   - answers ([State.Answered]) matched by delivery id and attempt: an
//     answer to an attempt given up on, sent again, or of a slot finished
//     changes nothing;
//   - retries: each failed attempt (a Retry, a panic, a timeout) is
//     charged to the event's budget, and an event that spends it is
//     dead-lettered; an attempt sent again because the handler was
//     replaced for another event's fault is free; a retry is sent again
//     once its delay passed ([State.Redeliver]) and the handler is ready;
//   - timeouts ([State.Tick]): a delivery unanswered for Timeout is a
//     failed attempt and gets the handler probed; nothing is sent while a
//     probe is out or the handler is replaced; a probe answered
//     ([State.ProbeAnswered]) resumes, one unanswered for ProbeWait
//     replaces the handler, as its stop does ([State.HandlerStopped]);
//     the deliveries a replaced handler had, not yet late, go to its
//     successor ([State.HandlerSpawned]);
//   - an unreadable event (Event.Err) is dead-lettered, never sent;
//   - dead letters: written ([State.LetterWritten]) the slot finishes;
//     failed ([State.LetterFailed]) it waits to be written again
//     ([State.RewriteLetter]);
//   - the finished prefix ([Effects.Finished]): the leading slots acked
//     or dead-lettered, for the checkpoint side (internal/checkpointing)
//     to move the acknowledged position over;
//   - a drain ([State.Drain]): nothing new is taken; among the slots
//     before the last one that left the waiting state, the waiting ones go
//     once their stream is free and the retrying ones at once, once; one
//     that fails again is left, with what follows it; the drain ends
//     ([Effects.Drained]) once nothing is with the handler or the store
//     and nothing more is to be sent — one that begins while the handler
//     is probed or replaced waits for it, and has a replaced one spawned
//     at once ([Effects.SpawnNow]);
//   - a stop at once ([State.Left]): the first slot, delivered and not
//     finished, is left to the successor at the same epoch with its
//     attempts, the one given up in flight not charged; one whose dead
//     letter is being written leaves the letter, written again by the
//     successor, the event not sent again;
//   - batches (Config.Batch, actors/batchdeliver.go): a slot is one
//     batch (MaxInFlight 1) whose delivery is its first event's; sent, it
//     takes the pending events [State.Lease] is given that follow, up to
//     MaxEvents and MaxBytes and before an unreadable one
//     ([Effects.Absorbed]); a BatchAck of a prefix finishes it, and the
//     first event not done becomes the slot's, a new delivery with its own
//     attempts, taking the BatchAck's Next; the rest go back to the front
//     of the pending list ([Effects.PutBack]); a batch failed as a whole
//     (a panic, a timeout, a Retry, an answer not a BatchAck) is charged
//     to no event — it says nothing of which one broke it — and is sent
//     as its first event alone until that finishes, charged for its own
//     failures, so a poison event is found, and charged, alone;
//   - function-handler runs (Config.RunEvents, actors/funcrun.go): a
//     handler that says so (Answer.Runs; reset when it is replaced) is
//     sent each slot as a run of the pending events that follow, up to
//     RunEvents and before an unreadable one; its answer
//     ([State.RunAnswered]) finishes the acked prefix and answers for the
//     event not acked as a single delivery, or, cut short, leaves it
//     waiting uncharged; the window ends a run itself ([Effects.EndRun],
//     answered by [State.RunEnded]) when its event in hand
//     ([State.RunProgress]) is late — a failed attempt — or its handler is
//     replaced — sent again uncharged, unless the handler answered it
//     meanwhile, whose answer counts; a drain cuts it short
//     ([Effects.CutRun]); a reader stopped at once leaves what
//     [State.LeftRun] says: a run not started yet, its first event a
//     retry, leaves that event at its attempt, as a waiting one; a run's
//     panic, as a single delivery's, does not start the handler's
//     replacements over.
//
// # The simulation
//
// sim_test.go runs the real State under a seeded scheduler playing the
// reader and its world — a handler that answers in any order, retries,
// panics, dead-letters, hangs and dies; a clock; lease checks answered
// late or found unsure; dead-letter writes that fail; drains followed by
// a successor window at the finished prefix; readers stopped at once,
// their successors carrying what [State.Left] leaves; stale answers — and checks
// after every step the invariants listed there. TestSimFindsTheFaults
// re-injects the window's past bugs (9fe9fc6, f43cd9d, 70b76e4, 164e52c,
// f128c71, the window's part of 8de5870 and b0fedd3, and the two run
// rules above that the window once kept as the actor had them) and mutations
// of its rules, batches' and runs' included, one at a time, and requires
// each found. A third of its seeds run batches (with poison events that
// break their batches), a third runs (a handler that goes through a run
// event by event, hangs in one, is cut short).
package window
