//go:build race

package main

// raceEnabled: the tests run under the race detector, and so does the
// binary they build.
const raceEnabled = true
