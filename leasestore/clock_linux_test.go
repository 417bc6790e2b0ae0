package leasestore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestBoottimeIsClockBoottime: the raw reading is CLOCK_BOOTTIME, the clock
// that counts a suspended host, as unix.ClockGettime reads it: it falls
// between two of its readings.
func TestBoottimeIsClockBoottime(t *testing.T) {
	t.Parallel()
	read := func() time.Duration {
		var ts unix.Timespec
		require.NoError(t, unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts))
		return time.Duration(ts.Nano())
	}
	for range 1000 {
		before := read()
		got := boottime()
		after := read()
		require.LessOrEqual(t, before, got)
		require.LessOrEqual(t, got, after)
	}
}

// BenchmarkBoottime compares the reading EnsureHeld makes with the call it
// replaced and with time.Now (two vDSO readings).
func BenchmarkBoottime(b *testing.B) {
	b.Run("raw", func(b *testing.B) {
		for b.Loop() {
			boottime()
		}
	})
	b.Run("unix.ClockGettime", func(b *testing.B) {
		var ts unix.Timespec
		for b.Loop() {
			_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
		}
	})
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			time.Now()
		}
	})
}
