//go:build !linux

package testenv

import "testing"

// PeerAddress: see netns_linux.go. Network namespaces are Linux's.
const PeerAddress = "198.18.0.1"

// RunInOwnNetwork runs the tests here: network namespaces are Linux's.
func RunInOwnNetwork(env ...string) (code int, ran bool) { return 0, false }

// OwnNetwork ends the test: it needs a network namespace, which only Linux
// has.
func OwnNetwork(t testing.TB) string {
	t.Helper()
	t.Skip("this test needs a network namespace of the test binary's own, which only Linux has")
	return ""
}
