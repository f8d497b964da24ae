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

// openNoFollow opens path with flag, failing on a symlink (O_NOFOLLOW)
// and never blocking on a FIFO or a device (O_NONBLOCK, which changes
// nothing for a regular file).
func openNoFollow(path string, flag int, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, perm)
}

// links is the number of names of the file fi.
func links(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}

// lock takes an exclusive flock on f, the lock file path. The kernel drops
// it when the process dies, so a crash never leaves the directory locked.
func lock(f *os.File, path string) error {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return errors.New("the data directory is in use by another image store (another osimages process, or an Open without Close in this one); give each server its own --data")
		}
		return fmt.Errorf("locking %s: %w", path, err)
	}
	return nil
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
