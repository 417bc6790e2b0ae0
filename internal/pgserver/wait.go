package pgserver

import "time"

// WaitFor polls cond with a growing interval (1 ms up to 50 ms) until it
// returns true or timeout passes, and reports whether it did.
func WaitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}
