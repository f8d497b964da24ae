//go:build linux

package imagestore

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// syncFileRangeWrite is SYNC_FILE_RANGE_WRITE: start writeback, do not wait.
const syncFileRangeWrite = 0x2

func startWriteback(f *os.File, off, n int64) {
	// Advisory: an error only means the final fsync does all the work.
	_ = syscall.SyncFileRange(int(f.Fd()), off, n, syncFileRangeWrite)
}

func available(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

func openNoFollow(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
}

// lockDir takes an exclusive flock on path. The kernel drops it when the
// process dies, so a crash never leaves the directory locked.
func lockDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errors.New("the data directory is in use by another image store (another osimages process, or an Open without Close in this one); give each server its own --data")
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return f, nil
}

// diskUsage is the space the files directly under dir take on disk (holes
// take none).
func diskUsage(dir string) int64 {
	des, _ := os.ReadDir(dir)
	var n int64
	for _, de := range des {
		if fi, err := de.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
	}
	return n
}
