package leasestore

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// boottime reads CLOCK_BOOTTIME: monotonic, and counting while the host is
// suspended (time.Now's monotonic reading, CLOCK_MONOTONIC, does not). On
// a kernel without it (before 2.6.39) every reading is the wall clock's.
//
// It is the system call unix.ClockGettime makes, made raw: clock_gettime
// never blocks, so the scheduler need not be told (entersyscall and
// exitsyscall, which cost as much as the call itself here). EnsureHeld
// reads it before every delivery. Go calls the vDSO, which would spare the
// system call, for CLOCK_REALTIME and CLOCK_MONOTONIC only; see
// docs/design/leases.md ("Suspended hosts") for why a cheaper stand-in, the wall
// clock, is not enough.
func boottime() time.Duration {
	var ts unix.Timespec
	if _, _, errno := unix.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_BOOTTIME, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return wallClock()
	}
	return time.Duration(ts.Nano())
}
