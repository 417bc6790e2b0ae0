package simrun

import (
	"flag"
	"fmt"
	"strings"
	"testing"
)

// Flags are a simulation's command-line flags: -seed, -seeds, -finds and
// -fault.
type Flags struct {
	seed  *uint64
	seeds *int
	finds *bool
	fault *string
}

// Register defines the flags, -seeds defaulting to seeds. Call it once
// per test binary, from a package-level variable.
func Register(seeds int) *Flags {
	return &Flags{
		seed:  flag.Uint64("seed", 0, "run only this seed of TestSim, printing its trace"),
		seeds: flag.Int("seeds", seeds, "how many seeds TestSim runs"),
		finds: flag.Bool("finds", false, "TestSimFindsTheFaults counts the seeds that find each fault"),
		fault: flag.String("fault", "", "TestSim -seed N runs with this fault of TestSimFindsTheFaults re-injected"),
	}
}

// Seeds is how many seeds TestSim runs.
func (f *Flags) Seeds() int { return *f.seeds }

// Run is one seed's run, replayed with its trace.
type Run struct {
	// Failed is the invariant broken, or "".
	Failed string
	// About says what the seed drew (its sizes, options), for the log.
	About string
	// Trace is the run's steps, one a line.
	Trace []string
}

// Fault is a past bug the simulation can re-inject: Set turns it on and
// returns what turns it off.
type Fault struct {
	Name string
	Set  func() (undo func())
	// Seeds, when more than -seeds, is how many seeds TestSimFindsTheFaults
	// tries for it: a fault that only a rare schedule shows.
	Seeds int
}

// Switch makes a Fault whose Set turns the variable *v to on, and its
// undo back to off: the usual way a simulation re-injects a past bug (a
// package-level fault variable the code under test consults).
func Switch[V any](name string, v *V, on, off V) Fault {
	return Fault{Name: name, Set: func() func() {
		*v = on
		return func() { *v = off }
	}}
}

// Sim is a simulation as the harness sees it.
type Sim struct {
	// Check runs a seed without keeping its trace, and returns the
	// invariant broken, or "".
	Check func(seed uint64) string
	// Replay runs a seed again with its trace.
	Replay func(seed uint64) Run
	// Faults are the past bugs it re-injects (TestSimFindsTheFaults).
	Faults []Fault
	// Noise, when set, leaves trace lines out of a failure's tail (the
	// steps of a quiet stretch).
	Noise func(line string) bool
}

// first runs seeds 1 to n and returns the first that fails (0: none).
func (s Sim) first(n int) uint64 {
	for seed := uint64(1); seed <= uint64(n); seed++ {
		if s.Check(seed) != "" {
			return seed
		}
	}
	return 0
}

// TestSim is the body of a package's TestSim: with -seed N it replays N
// (under -fault, when given) and logs its whole trace; otherwise it runs
// -seeds seeds and fails with the first failing one's violation and the
// tail of its trace.
func (f *Flags) TestSim(t *testing.T, s Sim) {
	t.Helper()
	if *f.seed != 0 {
		for _, m := range s.Faults {
			if m.Name == *f.fault {
				defer m.Set()()
			}
		}
		r := s.Replay(*f.seed)
		t.Logf("seed %d%s trace:\n%s", *f.seed, about(r), strings.Join(r.Trace, "\n"))
		if r.Failed != "" {
			t.Fatalf("seed %d: %s", *f.seed, r.Failed)
		}
		return
	}
	seed := s.first(*f.seeds)
	if seed == 0 {
		return
	}
	r := s.Replay(seed)
	var tail []string
	for _, l := range r.Trace {
		if s.Noise == nil || !s.Noise(l) {
			tail = append(tail, l)
		}
	}
	if len(tail) > 60 {
		tail = tail[len(tail)-60:]
	}
	t.Fatalf("seed %d: %s\nthe trace's tail (replay it whole with -seed %d):\n%s", seed, r.Failed, seed, strings.Join(tail, "\n"))
}

// TestSimFindsTheFaults is the body of a package's TestSimFindsTheFaults:
// each fault, re-injected alone, must be found within -seeds seeds (a
// bug the simulation cannot find is a gap in it); with -finds it also
// counts the seeds that find it, for the mutation table.
func (f *Flags) TestSimFindsTheFaults(t *testing.T, s Sim) {
	t.Helper()
	for _, m := range s.Faults {
		t.Run(m.Name, func(t *testing.T) {
			defer m.Set()()
			seeds := max(*f.seeds, m.Seeds)
			seed := s.first(seeds)
			if seed == 0 {
				t.Fatalf("the simulation did not find the fault in %d seeds", seeds)
			}
			t.Logf("first found at seed %d: %s", seed, s.Replay(seed).Failed)
			if *f.finds {
				found := 0
				for n := uint64(1); n <= uint64(seeds); n++ {
					if s.Check(n) != "" {
						found++
					}
				}
				t.Logf("%d of %d seeds find it", found, seeds)
			}
		})
	}
}

func about(r Run) string {
	if r.About == "" {
		return ""
	}
	return fmt.Sprintf(" (%s)", r.About)
}
