// Package coordplan is a group coordinator's decisions
// (actors/coordinator.go) as a pure, synchronous function: no goroutines,
// no clock, no database, no actors. [State] is what the coordinator knows
// — the slots it owns and at which epoch, those being handed off or given,
// those drained to a resize's cut, its readers by slot and incarnation,
// the resize — and each input ([State.Pass], [State.LostFence],
// [State.CutDrained], [State.Terminated], [State.Gone],
// [State.HandedOver], [State.BeginLeave], [State.Halt]) updates it and
// returns the [Action]s to carry out, in order: stop, drain, hand over,
// spawn and tell readers, run a pass, leave the pool. The coordinator actor
// carries them out — it spawns with the reader's queue and handled mark,
// stops, sends, runs lease calls off its mailbox — and feeds what comes of
// them back in as inputs.
//
// # Identity
//
// A reader is named by its slot and its incarnation: the [ID] the plan
// gave it when it asked for it to be spawned, and the epoch of the holding
// it serves. A report is about one reader (its end: [State.Terminated],
// [State.Gone]) or about one holding (a lost fence, a drain to the cut: by
// epoch), so a stale report — of a reader replaced since, of a holding
// claimed again at a new epoch — is recognised by what it names, not by
// the order it arrives in.
//
// # Level-triggered telling
//
// On every pass, and whenever it changes, every live reader of a held slot
// is told the whole desired state of its slot's resize ([Tell], see
// resizepart.Told): a reader that missed a message converges at the next.
//
// The simulation in sim_test.go drives pools of these coordinators over a
// simulated lease table and simulated readers under a seeded scheduler
// that delays and reorders every report; TestSimFindsTheFaults re-injects
// the coordinator's past bugs, one at a time, and shows it finds each.
package coordplan
