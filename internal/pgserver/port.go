package pgserver

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// The ports FreePort chooses from when the ephemeral range cannot be read
// or leaves no room below it.
const (
	portFloor   = 10000
	defaultHigh = 32768 // Linux's default ip_local_port_range starts here
)

// FreePort returns a loopback TCP port that is free now, chosen at random
// below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range).
//
// A port from the ephemeral range (what listening on port 0 gives) is the
// range every outgoing connection takes its local port from: between the
// moment FreePort returns and the moment a server binds the port, one of
// the hundreds of connections a test suite opens can take it, and the
// server fails with "address already in use". Below the range only another
// FreePort caller can collide, and a random choice among some 20,000 ports
// makes that rare.
func FreePort() (int, error) {
	lo, hi := portFloor, ephemeralLow()
	var lastErr error
	for range 64 {
		port := lo + rand.IntN(hi-lo)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			lastErr = err
			continue
		}
		_ = l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("pgtest: no free port in %d–%d: %w", lo, hi-1, lastErr)
}

// ephemeralLow is the first port of the kernel's ephemeral range, or
// defaultHigh when it cannot be read or leaves no room above portFloor.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultHigh
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return defaultHigh
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= portFloor+1000 {
		return defaultHigh
	}
	return low
}
