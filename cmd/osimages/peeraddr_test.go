package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// The replicas' peer listeners must be named in EndpointSlices, and the
// apiserver refuses loopback addresses there: the tests give themselves an
// address of their own, on an interface made for this test binary (one end
// of a veth pair, both ends in this namespace: a dummy interface would do,
// but containers often lack its module), in 198.18.0.0/15, the range set
// aside for benchmarks (RFC 2544), rather than take whatever address the
// machine has. They need root to make it, and fail, not skip, without it.

// peerIface is this binary's interface: "osimg" and the pid (its veth peer
// "osimgp" and the pid), so that two test binaries never share one, and
// one left by a killed binary is recognised and removed.
var peerIface struct {
	once sync.Once
	name string
	ip   string
	err  error
}

const peerIfacePrefix = "osimg"

// peerIP is the address of this binary's interface, made at first use.
func peerIP(t *testing.T) string {
	t.Helper()
	peerIface.once.Do(func() {
		removeStalePeerIfaces()
		pid := os.Getpid()
		peerIface.name = peerIfacePrefix + strconv.Itoa(pid)
		peerIface.ip = fmt.Sprintf("198.18.%d.%d", (pid>>8)&0xff, pid&0xff)
		for _, args := range [][]string{
			{"link", "add", peerIface.name, "type", "veth", "peer", "name", peerIfacePrefix + "p" + strconv.Itoa(pid)},
			{"addr", "add", peerIface.ip + "/32", "dev", peerIface.name},
			{"link", "set", peerIfacePrefix + "p" + strconv.Itoa(pid), "up"},
			{"link", "set", peerIface.name, "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				peerIface.err = fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
				return
			}
		}
	})
	if peerIface.err != nil {
		t.Fatalf("the replica tests need an address of their own for the peer listeners (the apiserver refuses loopback addresses in EndpointSlices), on an interface they make as root: %v", peerIface.err)
	}
	return peerIface.ip
}

// removePeerIface removes this binary's interface (and its veth peer), if
// it made one.
func removePeerIface() {
	if peerIface.name != "" && peerIface.err == nil {
		_ = exec.Command("ip", "link", "del", peerIface.name).Run()
	}
}

// removeStalePeerIfaces removes the interfaces of test binaries that are
// gone (killed before their cleanup).
func removeStalePeerIfaces() {
	ifaces, err := net.Interfaces()
	if err != nil {
		return
	}
	for _, i := range ifaces {
		pid, err := strconv.Atoi(strings.TrimPrefix(i.Name, peerIfacePrefix))
		if !strings.HasPrefix(i.Name, peerIfacePrefix) || err != nil {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = exec.Command("ip", "link", "del", i.Name).Run()
		}
	}
}

// freeHostAddr is a free address on this binary's own peer address.
func freeHostAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(peerIP(t), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
