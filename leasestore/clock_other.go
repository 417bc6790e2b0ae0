//go:build !linux

package leasestore

import "time"

// boottime is the wall clock where kumi reads no boot clock: it counts a
// suspension, and a forward step of it can only make EnsureHeld fail early.
func boottime() time.Duration { return wallClock() }
