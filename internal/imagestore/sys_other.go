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

func openNoFollow(path string) (*os.File, error) {
	return os.Open(path)
}

func lockDir(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}

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
