package imagestore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Every file of the data directory is opened through these helpers, so that
// whatever is planted there (a FIFO, a device, a symlink, a hard link to a
// file elsewhere, a huge file) can neither hang the server nor be written
// through: a file is opened without following a symlink and without
// blocking (O_NOFOLLOW|O_NONBLOCK), and what the open descriptor turns out
// to be (fstat, so there is no window between the check and the use)
// decides whether it is used. The side files the store reads whole
// (metadata, checkpoints) are read to a bound.

// oddFile says that a path of the data directory is not a file the store
// could have made there: the store does not use it.
type oddFile struct {
	path string
	// what it is instead: "a FIFO", "a symlink to /dev/zero", "a regular
	// file with 2 links", "larger than 4096 bytes".
	what string
}

func (e *oddFile) Error() string {
	return fmt.Sprintf("%s is %s, not a file the image store wrote", e.path, e.what)
}

// isOddFile says whether err is (or wraps) an *oddFile.
func isOddFile(err error) bool {
	var odd *oddFile
	return errors.As(err, &odd)
}

// openRegular opens path for reading. It refuses, with an *oddFile, a
// symlink and anything but a regular file, and never blocks on a FIFO.
func openRegular(path string) (*os.File, error) {
	return openChecked(path, os.O_RDONLY, 0, false)
}

// openOwned opens path, with flag (os.O_RDWR, os.O_WRONLY, with or without
// os.O_CREATE), to write it in place. Besides what openRegular refuses, it
// refuses a file with more than one link: the store never makes hard
// links, so a second name is someone else's file, which a write (or a
// truncation) must not reach.
func openOwned(path string, flag int) (*os.File, error) {
	return openChecked(path, flag, 0o644, true)
}

func openChecked(path string, flag int, perm fs.FileMode, owned bool) (*os.File, error) {
	f, err := openNoFollow(path, flag, perm)
	if err != nil {
		// A symlink (ELOOP), a FIFO without a reader (ENXIO), a directory
		// (EISDIR): say what is there rather than how open failed.
		if fi, lerr := os.Lstat(path); lerr == nil && (!fi.Mode().IsRegular() || owned && links(fi) > 1) {
			return nil, &oddFile{path, describe(path, fi)}
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() || owned && links(fi) > 1 {
		f.Close()
		return nil, &oddFile{path, describe(path, fi)}
	}
	return f, nil
}

// readRegular reads the regular file path, of at most limit bytes.
func readRegular(path string, limit int64) ([]byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, &oddFile{path, fmt.Sprintf("larger than %d bytes", limit)}
	}
	return data, nil
}

// checkOwned says how the file fi (from Lstat) at path differs from a file
// the store writes in place, or "".
func checkOwned(path string, fi fs.FileInfo) string {
	if fi.Mode().IsRegular() && links(fi) <= 1 {
		return ""
	}
	return describe(path, fi)
}

// describe names what the file fi at path is, for an *oddFile.
func describe(path string, fi fs.FileInfo) string {
	m := fi.Mode()
	switch {
	case m&fs.ModeSymlink != 0:
		if to, err := os.Readlink(path); err == nil {
			return "a symlink to " + to
		}
		return "a symlink"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsRegular() && links(fi) > 1:
		return fmt.Sprintf("a regular file with %d links (a hard link to a file elsewhere)", links(fi))
	case m.IsRegular():
		return "a regular file"
	}
	return "a special file (" + m.Type().String() + ")"
}

// writeNew writes data into a file made afresh at path: whatever had the
// name (a symlink, a hard link) is removed first, never written through.
func writeNew(path string, data []byte) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// O_EXCL: a name made again meanwhile fails the write, and a symlink
	// is never followed.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
