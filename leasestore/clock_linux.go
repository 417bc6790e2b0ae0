package leasestore

import (
	"time"

	"golang.org/x/sys/unix"
)

// boottime reads CLOCK_BOOTTIME: monotonic, and counting while the host is
// suspended (time.Now's monotonic reading, CLOCK_MONOTONIC, does not). On
// a kernel without it (before 2.6.39) every reading is the wall clock's.
func boottime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return wallClock()
	}
	return time.Duration(ts.Nano())
}
