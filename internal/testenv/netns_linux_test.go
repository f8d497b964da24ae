//go:build linux

package testenv

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// netnsHelperEnv makes TestOwnNetworkHelper the test binary of a test run
// in its own network namespace.
const netnsHelperEnv = "OSIMAGES_TESTENV_NETNS_HELPER"

// TestOwnNetworkHelper is a test binary's TestMain as the replica tests'
// is: it runs again in a network namespace of its own, where it listens on
// a peer address, dials it, says which namespace it is in, and waits for
// its standard input to close.
func TestOwnNetworkHelper(t *testing.T) {
	if os.Getenv(netnsHelperEnv) == "" {
		return // run by TestOwnNetworkLeavesTheMachineAlone only
	}
	if code, ran := RunInOwnNetwork(); ran {
		os.Exit(code)
	}
	addr := FreePeerAddr(t)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dialing the peer address in the namespace: %v", err)
	}
	c.Close()
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("ready %s %s %d\n", ns, addr, os.Getpid())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// TestOwnNetworkLeavesTheMachineAlone runs a test binary in its own network
// namespace and checks, while it listens on its peer address, that the
// machine's namespace has not changed (no link, no address), then that its
// namespace is gone once it ends, also when the binary is killed.
func TestOwnNetworkLeavesTheMachineAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		Missing(t, "a network namespace of the test binary's own needs root")
	}
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	before := hostNetwork(t)
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("killed=%v", kill), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestOwnNetworkHelper$", "-test.v")
			cmd.Env = append(os.Environ(), netnsHelperEnv+"=1")
			// The run inside waits for its standard input to close: this
			// test holds it open until the end, so that a killed binary's
			// run inside does not end for want of input.
			stdinR, stdin, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			cmd.Stdin = stdinR
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stdinR.Close()
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			var ns, addr string
			var pid int
			var out []string
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				out = append(out, sc.Text())
				if n, _ := fmt.Sscanf(sc.Text(), "ready %s %s %d", &ns, &addr, &pid); n == 3 {
					break
				}
			}
			if ns == "" {
				t.Fatalf("the test binary did not get to listen in a namespace of its own; its output:\n%s", strings.Join(out, "\n"))
			}
			if ns == host {
				t.Fatalf("the test binary ran in the machine's network namespace %s", host)
			}
			if addr != net.JoinHostPort(PeerAddress, strings.TrimPrefix(addr, PeerAddress+":")) {
				t.Errorf("the test binary listened on %s, not on %s", addr, PeerAddress)
			}
			if during := hostNetwork(t); !slices.Equal(during, before) {
				t.Errorf("the machine's network namespace changed while the test binary ran in its own:\nbefore: %v\nduring: %v", before, during)
			}
			if kill {
				// The binary outside, killed: the run inside goes with it.
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
			} else {
				stdin.Close()
			}
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			err = cmd.Wait()
			if !kill && err != nil {
				t.Errorf("the test binary in its own namespace failed: %v", err)
			}
			Eventually(t, "the test binary's namespace freed once it ended", 30*time.Second, func() (bool, string) {
				if holders := processesIn(ns); len(holders) > 0 {
					return false, fmt.Sprintf("%s still held by pids %v (the run inside was pid %d)", ns, holders, pid)
				}
				return true, ""
			})
		})
	}
	if after := hostNetwork(t); !slices.Equal(after, before) {
		t.Errorf("the machine's network namespace changed:\nbefore: %v\nafter: %v", before, after)
	}
}

// hostNetwork lists this namespace's links and addresses.
func hostNetwork(t *testing.T) []string {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var list []string
	for _, i := range ifaces {
		addrs, err := i.Addrs()
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, fmt.Sprintf("%s %v", i.Name, addrs))
	}
	slices.Sort(list)
	return list
}

// processesIn lists the processes whose network namespace is ns.
func processesIn(ns string) []string {
	links, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	var pids []string
	for _, l := range links {
		// A process that ended while being read is not one.
		if got, err := os.Readlink(l); err == nil && got == ns {
			pids = append(pids, strings.Split(l, "/")[2])
		}
	}
	return pids
}
