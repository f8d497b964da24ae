//go:build linux

package testenv

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// SmallFS mounts a tmpfs of size bytes on a new temporary directory and
// returns it, for tests of what happens when the disk fills up. It is
// unmounted when the test ends. Mounting needs root (CAP_SYS_ADMIN);
// without it, or off Linux, the test is skipped, saying why.
func SmallFS(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a small file system is a tmpfs mount, which needs root (CAP_SYS_ADMIN); run the tests as root to include this one")
	}
	dir, err := os.MkdirTemp("", "osimages-smallfs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		os.Remove(dir)
		t.Skipf("mounting a tmpfs of %d bytes on %s: %v (the test needs CAP_SYS_ADMIN)", size, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting the tmpfs %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return dir
}
