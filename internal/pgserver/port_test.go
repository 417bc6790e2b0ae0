package pgserver

import (
	"net"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFreePortIsBelowTheEphemeralRange: a port from the ephemeral range can
// be taken by any outgoing connection before the server binds it (CI saw a
// worker fail with "bind: address already in use" on port 33763).
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	for range 50 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < portFloor || port >= low {
			t.Fatalf("FreePort() = %d, want a port in [%d, %d)", port, portFloor, low)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("FreePort() = %d, which cannot be listened on: %v", port, err)
		}
		_ = l.Close()
	}
}
