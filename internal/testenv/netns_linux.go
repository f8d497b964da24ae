//go:build linux

package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// The replica tests name their peer listeners in EndpointSlices, and the
// apiserver refuses loopback addresses there: they need an address of
// their own. No test may add one to the machine's network namespace, so the
// test binary that needs one runs again inside a network namespace made for
// it alone (RunInOwnNetwork), where PeerAddress sits on the namespace's
// loopback. The namespace has no name and no other interface: nothing in
// it reaches the machine's network, nothing outside sees it, and the kernel
// frees it with its last process, also when the test binary is killed.

// PeerAddress is the address the tests give to listeners that must be named
// in an EndpointSlice. It is in 198.18.0.0/15, the range set aside for
// benchmarks (RFC 2544), and exists only in the test binary's own network
// namespace.
const PeerAddress = "198.18.0.1"

// ownNetworkEnv marks the test binary run in its own network namespace; its
// value names the namespace it was started from, which the run checks it is
// not in before it changes anything.
const ownNetworkEnv = "OSIMAGES_TEST_OWN_NETWORK"

// ownNetwork says whether this process runs in a namespace of its own with
// PeerAddress set up, and if not, why.
var ownNetwork struct {
	ready bool
	why   string
}

// RunInOwnNetwork runs this test binary again, with the same arguments,
// inside a new network namespace, and returns its exit code with ran set:
// TestMain then exits with it. It is called first in TestMain, once
// whatever needs the machine's network (building a binary, downloading
// modules) is done; env is added to the environment of the run inside.
//
// Inside the namespace (the second run) it brings the loopback up with
// PeerAddress and a default route on it (kube-apiserver advertises the
// address of the default route's interface and will not start without
// one), and returns ran false: the tests run there. Where no namespace can
// be made (not root, no iproute2), it returns ran false too and the tests
// run here; OwnNetwork then ends those that need the namespace, saying why.
func RunInOwnNetwork(env ...string) (code int, ran bool) {
	if from, inside := os.LookupEnv(ownNetworkEnv); inside {
		if err := setUpOwnNetwork(from); err != nil {
			ownNetwork.why = err.Error()
		} else {
			ownNetwork.ready = true
		}
		return 0, false
	}
	if os.Geteuid() != 0 {
		ownNetwork.why = "a network namespace of the test binary's own needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run the tests as root"
		return 0, false
	}
	if _, err := exec.LookPath("ip"); err != nil {
		ownNetwork.why = "the ip command (iproute2) is not installed: it sets up the loopback of the test binary's own network namespace (hack/tools.sh installs it)"
		return 0, false
	}
	from, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		ownNetwork.why = fmt.Sprintf("reading this process's network namespace: %v", err)
		return 0, false
	}
	self, err := os.Executable()
	if err != nil {
		ownNetwork.why = fmt.Sprintf("finding the test binary to run it again: %v", err)
		return 0, false
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(append(os.Environ(), env...), ownNetworkEnv+"="+from)
	// Pdeathsig goes with the thread that started the run: keep this
	// goroutine on it until the run ends, so that the run, and with it the
	// namespace, never outlives this process.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGHUP)
	defer signal.Stop(signals)
	if err := cmd.Start(); err != nil {
		// The kernel refused the namespace (a container without
		// CAP_SYS_ADMIN, say): run here, without it.
		ownNetwork.why = fmt.Sprintf("the machine refuses a network namespace for the test binary (clone CLONE_NEWNET: %v)", err)
		return 0, false
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-signals:
			// go test's timeout sends SIGQUIT here, ^C SIGINT: the run
			// inside dumps its goroutines or stops its processes itself.
			_ = cmd.Process.Signal(sig)
		case err := <-done:
			var exit *exec.ExitError
			switch {
			case err == nil:
				return 0, true
			case errors.As(err, &exit) && exit.ExitCode() >= 0:
				return exit.ExitCode(), true
			default:
				fmt.Fprintf(os.Stderr, "testenv: the tests in their own network namespace ended: %v\n", err)
				return 1, true
			}
		}
	}
}

// setUpOwnNetwork sets up the namespace this process was started in, after
// checking that it is not the one named from, the machine's.
func setUpOwnNetwork(from string) error {
	here, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("reading this process's network namespace: %v", err)
	}
	if here == from {
		return fmt.Errorf("%s is set (to %s) but this process runs in that namespace: it is not one of the test binary's own, and nothing is added to it", ownNetworkEnv, from)
	}
	// replace, not add: a test binary that a test runs again inside
	// finds the namespace set up already.
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "replace", PeerAddress + "/32", "dev", "lo"},
		{"route", "replace", "default", "dev", "lo"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("setting up the test binary's own network namespace: ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// OwnNetwork returns PeerAddress when the test runs in a network namespace
// of its own (RunInOwnNetwork), or ends the test, saying why: through
// Missing, so that where OSIMAGES_REQUIRE_ALL is set (CI, as root) a run
// without the namespace fails.
func OwnNetwork(t testing.TB) string {
	t.Helper()
	if !ownNetwork.ready {
		why := ownNetwork.why
		if why == "" {
			why = "TestMain did not call testenv.RunInOwnNetwork"
		}
		Missing(t, "this test needs an address of its own for listeners named in EndpointSlices (the apiserver refuses loopback there), in a network namespace of the test binary's own: %s", why)
	}
	return PeerAddress
}
