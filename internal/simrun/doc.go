// Package simrun runs the seeded simulations of kumi's state machines
// (internal/readfeed, internal/checkpointing, internal/resizepart,
// internal/coordplan) the same way: TestSim over a budget of seeds, one
// seed replayed with its whole trace, and TestSimFindsTheFaults, which
// re-injects each past bug and requires the simulation to find it. Each
// package's simulation is its own; this is only the harness around it.
//
//	go test -run TestSim ./internal/readfeed/ -seed N [-fault Name]   # one seed, its trace
//	go test -run TestSim ./internal/readfeed/ -seeds 100000            # more seeds
//	go test -run TestSimFindsTheFaults -v ./internal/readfeed/ -finds  # seeds that find each fault
package simrun
