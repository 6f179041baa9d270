package testnet

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePortIsBindableAndOutsideTheEphemeralRange(t *testing.T) {
	top := ephemeralStart()
	seen := map[string]bool{}
	for range 50 {
		p := FreePort(t)
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatal(err)
		}
		if top-lowestPort >= 1000 && (n < lowestPort || n >= top) {
			t.Errorf("port %d is inside the kernel's ephemeral range (from %d)", n, top)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", p))
		if err != nil {
			t.Fatalf("FreePort gave %s, which cannot be bound: %v", p, err)
		}
		_ = l.Close()
		seen[p] = true
	}
	if len(seen) < 40 {
		t.Errorf("50 picks gave only %d distinct ports: concurrent tests would collide", len(seen))
	}
}
