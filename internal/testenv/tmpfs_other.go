//go:build !linux

package testenv

import "testing"

// SmallFS skips the test: a small file system is a tmpfs mount, made on
// Linux only.
func SmallFS(t testing.TB, _ int64) string {
	t.Helper()
	t.Skip("a small file system is a tmpfs mount, which this test makes on Linux only")
	return ""
}
