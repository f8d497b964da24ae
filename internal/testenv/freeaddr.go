package testenv

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FreeAddr is a free address on 127.0.0.1 for a server a test starts (and
// may restart on the same address). The port is taken below the kernel's
// ephemeral range: a port of that range, free when looked at, can be the
// local port of any outgoing connection of the tests running in parallel by
// the time the server binds it ("address already in use").
func FreeAddr(t testing.TB) string {
	t.Helper()
	return freeAddrOn(t, "127.0.0.1")
}

// FreePeerAddr is a free address on PeerAddress, for a listener a test names
// in an EndpointSlice, or ends the test when it does not run in a network
// namespace of its own (OwnNetwork).
func FreePeerAddr(t testing.TB) string {
	t.Helper()
	return freeAddrOn(t, OwnNetwork(t))
}

func freeAddrOn(t testing.TB, host string) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	if low > 11000 {
		for range 200 {
			addr := net.JoinHostPort(host, strconv.Itoa(10000+rand.IntN(low-10000)))
			if ln, err := net.Listen("tcp", addr); err == nil {
				ln.Close()
				return addr
			}
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
