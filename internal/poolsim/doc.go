// Package poolsim is a deterministic simulation of a whole pool, built
// from the core's real state machines: K workers, each a coordinator
// (internal/coordplan) whose readers are made of a read side
// (internal/readfeed), a delivery window (internal/window) and a
// checkpoint side (internal/checkpointing), over a simulated store, lease
// table, publisher, handlers and clock, under a seeded scheduler that
// reorders every message and every effect's result. The package holds
// only its test (sim_test.go); docs/design/architecture.md ("The pool
// simulation") says what it composes, the faults it injects and the
// invariants it checks after every step.
//
//	go test -run TestSim ./internal/poolsim/ -seed N   # replay one seed, with its trace
//	go test -run TestSim ./internal/poolsim/ -seeds 100000
package poolsim
