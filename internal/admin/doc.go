// Package admin does every operator action once — a checkpoint reset, a
// relinquish (the first phase of leasestore's two-phase handoff), and the
// replay and discard of one dead letter, an action on a parked stream — for both front ends: `kumi`
// (cmd/kumi) and the console (package console). Each action validates its
// input, applies the guards of the stores it calls, acts, and returns a
// typed outcome; a refusal is a *[Refusal], whose Kind says whose fault it
// is (bad input, an unknown name, a state that forbids it) and which wraps
// the stores' typed errors (*leasestore.HeldError,
// *leasestore.HandoffError) for a caller that words them itself. The CLI
// renders the outcome as text or JSON with its flags' names; the console as
// JSON with the refusal's own message.
//
// The package is internal: its callers are kumi's own front ends, and an
// embedding service calls the stores (eventsource.Store.ResetCheckpoint,
// leasestore.RequestHandoff, eventsource.Store.ReplayDeadLetters) directly,
// so publishing it would add to the public surface a second way to do what
// the stores already offer.
package admin
