//go:build race

package integration

// raceEnabled: the test binary runs under the race detector, and so do the
// worker processes it builds.
const raceEnabled = true
