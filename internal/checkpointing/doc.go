// Package checkpointing is a bucket reader's checkpoint side as a pure,
// synchronous state machine: no goroutines, no clock, no database. It
// keeps the acknowledged position — how far the delivery window's
// finished prefix reaches — and the fenced checkpoint writes that follow
// it: one write at a time, every CheckpointEvery acknowledged events and
// at every tick (CheckpointInterval), at once when a reader resumes after
// what its predecessor at the same epoch handled, and a last one when the
// reader drains. The reader actor (actors/deliver.go) feeds it the acks
// its window computes, the ticks of its timer and the answers of the
// writes it carries out, and does what the [Effects] and the [Verdict] of
// a failed write say.
//
// # Phases
//
// One [Phase] holds what the checkpoint side is doing: [Idle], no write
// out; [Writing], one write out, answered by [State.Written] or
// [State.Failed]; [Abandoned], a write failed under an unsure lease and
// none is tried again — the reader lets its events in flight finish and
// stops, and its successor at the same epoch starts after what it acked
// (the handled mark, see [State.Resume]).
//
// # Identity
//
// Every write names itself ([Write.ID]); its answer names it back. An
// answer of a write the state no longer waits for changes nothing,
// whatever the order it arrives in.
//
// # The simulation
//
// sim_test.go runs the real State inside a simulated reader — a window
// whose handler answers out of order, late and twice, exactly-once
// commits, fenced writes that fail in every way the store fails, ticks,
// drains at random points, unsure and lost leases, restarts at the same
// epoch with the handled mark, crashes — and checks after every step that
// the checkpoint never passes an unfinished event, never goes back, that
// at most one write is out, that a tick writes what is acked, that a
// drain ends with everything up to it acknowledged and written, and that
// no event finished on a graceful path is delivered again.
// TestSimFindsTheFaults re-injects the checkpoint side's bugs fixed in the
// past, one at a time, and requires each found (docs/design/architecture.md,
// "The checkpoint side").
package checkpointing
