// Package testnet hands tests loopback ports nobody listens on, for processes they start.
package testnet

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"
)

// Ports are picked at random below the kernel's ephemeral range: a port taken from there (by
// binding port 0 and closing) can be handed by the kernel to any outgoing connection before
// the process under test listens on it, and another test process doing the same gets the
// same few recently freed ports. Below the range only other explicit picks compete, and a
// random one among thousands seldom meets them.
const (
	lowestPort   = 10000
	defaultFirst = 32768 // Linux's default start of the ephemeral range
)

// ephemeralStart is the first port the kernel assigns on its own.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultFirst
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil {
		return defaultFirst
	}
	return first
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, outside the kernel's
// ephemeral range where it can.
func FreePort(tb testing.TB) string {
	tb.Helper()
	if top := ephemeralStart(); top-lowestPort >= 1000 {
		for range 100 {
			port := lowestPort + rand.IntN(top-lowestPort)
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				_ = l.Close()
				return strconv.Itoa(port)
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// FreeAddr is FreePort as host:port.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", FreePort(tb))
}
