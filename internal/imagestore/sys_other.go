//go:build !linux

package imagestore

import (
	"errors"
	"os"
)

// osimages serves from Linux; elsewhere the store works without the
// writeback hint, the free-space figure and the directory lock.

func startWriteback(*os.File, int64, int64) {}

func available(string) (uint64, error) {
	return 0, errors.New("free space is only known on Linux")
}

// openNoFollow checks path is no symlink before it opens it: not race-free,
// as O_NOFOLLOW is on Linux.
func openNoFollow(path string, flag int, perm os.FileMode) (*os.File, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return nil, &os.PathError{Op: "open", Path: path, Err: errors.New("is a symlink")}
	}
	return os.OpenFile(path, flag, perm)
}

func links(os.FileInfo) uint64 { return 1 }

func lock(*os.File, string) error { return nil }

// diskUsage is the size of the files directly under dir.
func diskUsage(dir string) int64 {
	des, _ := os.ReadDir(dir)
	var n int64
	for _, de := range des {
		if fi, err := de.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}
