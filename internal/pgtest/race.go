//go:build race

package pgtest

// RaceEnabled reports whether this binary was built with the race detector.
const RaceEnabled = true
