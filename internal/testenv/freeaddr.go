package testenv

import (
	"fmt"
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
			addr := fmt.Sprintf("127.0.0.1:%d", 10000+rand.IntN(low-10000))
			if ln, err := net.Listen("tcp", addr); err == nil {
				ln.Close()
				return addr
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
