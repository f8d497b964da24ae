package imagestore

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
)

// What is planted in the data directory in these tests: FIFOs, devices
// (through a symlink), symlinks and hard links to files outside it, huge
// files. The store must never block on one, never read one without bound,
// and never write through one.

// neverBlocks is how long an operation that must not block (it reads no
// network, only a few local files) may take before the test calls it
// blocked. It is a ceiling for "for ever", not a measure of speed.
const neverBlocks = time.Minute

// within runs f and fails the test when it has not returned after
// neverBlocks; unblock, if not nil, is then called so that f can end (a
// FIFO opened from the other side, say) and the test report.
func within(t *testing.T, what string, unblock func(), f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return
	case <-time.After(neverBlocks):
	}
	if unblock != nil {
		unblock()
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	t.Fatalf("%s: still blocked after %s", what, neverBlocks)
}

// mkfifo makes a FIFO at path, and returns what opens its other end (so
// that an open blocked on it returns).
func mkfifo(t *testing.T, path string) func() {
	t.Helper()
	os.Remove(path)
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	return func() {
		// Both ends, non-blocking: whichever side the store is blocked on
		// gets its peer. Closing at once gives a reader an end of file.
		if f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	}
}

func logged(t *testing.T) (*logBuffer, Option) {
	t.Helper()
	logs := &logBuffer{}
	return logs, WithLogger(slog.New(slog.NewJSONHandler(logs, nil)))
}

// TestOpenSetsAsideAnEntryWithOddMetadata: a stored image whose metadata
// side file is a FIFO, a device, a symlink (even to a copy of the right
// metadata), a directory, a huge file or garbage neither blocks the Open
// (on today's main a FIFO blocked it for ever: the server never listened)
// nor costs the image's bytes: the entry is set aside, whole, out of
// images/, with a warning that names the file, what it is and what to do;
// the other images are served; the image commits again; a later Open
// reminds that it is set aside.
func TestOpenSetsAsideAnEntryWithOddMetadata(t *testing.T) {
	elsewhere := t.TempDir()
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, meta string, good []byte) (unblock func())
		what  string
	}{
		{"fifo", func(t *testing.T, meta string, _ []byte) func() { return mkfifo(t, meta) }, "a FIFO"},
		{"device", func(t *testing.T, meta string, _ []byte) func() {
			os.Remove(meta)
			if err := os.Symlink("/dev/zero", meta); err != nil {
				t.Fatal(err)
			}
			return nil
		}, "a symlink to /dev/zero"},
		{"symlink to the right metadata", func(t *testing.T, meta string, good []byte) func() {
			copied := filepath.Join(elsewhere, "meta.json")
			os.WriteFile(copied, good, 0o644)
			os.Remove(meta)
			if err := os.Symlink(copied, meta); err != nil {
				t.Fatal(err)
			}
			return nil
		}, "a symlink to " + filepath.Join(elsewhere, "meta.json")},
		{"directory", func(t *testing.T, meta string, _ []byte) func() {
			os.Remove(meta)
			if err := os.Mkdir(meta, 0o755); err != nil {
				t.Fatal(err)
			}
			return nil
		}, "a directory"},
		{"huge", func(t *testing.T, meta string, _ []byte) func() {
			if err := os.Truncate(meta, 1<<30); err != nil {
				t.Fatal(err)
			}
			return nil
		}, "larger than"},
		{"garbage", func(t *testing.T, meta string, _ []byte) func() {
			os.WriteFile(meta, []byte("{not json"), 0o644)
			return nil
		}, "metadata: invalid character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			logs, withLogs := logged(t)
			s, err := Open(dir, withLogs)
			if err != nil {
				t.Fatal(err)
			}
			good := put(t, s, devregistry.DiskContent(64<<10, 1), "good.raw")
			content := devregistry.DiskContent(256<<10, 2)
			odd := put(t, s, content, "odd.raw")
			s.Close()
			meta := filepath.Join(dir, imagesDir, string(odd.SHA256), MetadataName)
			goodMeta, _ := os.ReadFile(meta)
			unblock := tc.plant(t, meta, goodMeta)

			within(t, "Open with "+tc.name+" metadata", unblock, func() { s, err = Open(dir, withLogs) })
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			if l := s.List(); len(l) != 1 || l[0].SHA256 != good.SHA256 {
				t.Fatalf("List = %+v, want only the good image", l)
			}
			if got := readAll(t, s, good.SHA256); len(got) != int(good.Size) {
				t.Errorf("the good image reads %d bytes", len(got))
			}
			if _, err := os.Lstat(filepath.Join(dir, imagesDir, string(odd.SHA256))); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the entry is still in images/: %v", err)
			}
			aside, _ := filepath.Glob(filepath.Join(dir, setAsideDir, string(odd.SHA256)+"-*", "odd.raw"))
			if len(aside) != 1 {
				t.Fatalf("set aside: %v; want the image file kept under %s", aside, setAsideDir)
			}
			if kept, _ := os.ReadFile(aside[0]); !bytes.Equal(kept, content) {
				t.Errorf("the bytes set aside (%d) are not the image's", len(kept))
			}
			line := grepLine(logs.String(), "set aside")
			for _, want := range []string{`"level":"WARN"`, string(odd.SHA256), filepath.Dir(aside[0]), tc.what, "downloaded again", "delete it"} {
				if !strings.Contains(line, want) {
					t.Errorf("log line %q: want it to say %q", line, want)
				}
			}
			if tc.name != "garbage" && !strings.Contains(line, meta) {
				t.Errorf("log line %q: want it to name %s", line, meta)
			}
			// The image commits again, and a restart reminds of what is set
			// aside.
			put(t, s, content, "odd.raw")
			s.Close()
			s, err = Open(dir, withLogs)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := s.Get(odd.SHA256); !ok {
				t.Error("the image committed again is not listed after a restart")
			}
			if reminder := grepLine(logs.String(), "holds stored images set aside"); !strings.Contains(reminder, filepath.Base(filepath.Dir(aside[0]))) {
				t.Errorf("no reminder of what is set aside at the next Open:\n%s", logs.String())
			}
		})
	}
}

// TestOpenNeverBlocksOnAnOddImageFile: an image file replaced by a FIFO
// after the store listed it is dropped as tampered with when it is served
// or scrubbed; on today's main the open blocked for ever, holding the HTTP
// handler (and the scrub).
func TestOpenNeverBlocksOnAnOddImageFile(t *testing.T) {
	for _, by := range []string{"Open", "Scrub"} {
		t.Run(by, func(t *testing.T) {
			dir := t.TempDir()
			logs, withLogs := logged(t)
			s, err := Open(dir, withLogs)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			content := devregistry.DiskContent(64<<10, 3)
			e := put(t, s, content, "img.raw")
			path := filepath.Join(dir, imagesDir, string(e.SHA256), "img.raw")
			unblock := mkfifo(t, path)
			within(t, by+" of a FIFO", unblock, func() {
				if by == "Open" {
					var f *os.File
					f, _, err = s.Open(e.SHA256)
					if f != nil {
						f.Close()
					}
					return
				}
				_, err = s.Scrub(context.Background(), e.SHA256, func(context.Context, int) error { return nil }, nil)
			})
			if !errors.Is(err, ErrTampered) || !strings.Contains(err.Error(), "a FIFO") {
				t.Fatalf("%s = %v, want ErrTampered naming a FIFO", by, err)
			}
			if !strings.Contains(grepLine(logs.String(), "stored image dropped"), "a FIFO") {
				t.Errorf("log: %s", logs.String())
			}
			put(t, s, content, "img.raw")
		})
	}
}

// TestOpenRefusesTopLevelSymlinks: the store's own directories are
// directories of the data directory, never a symlink to one elsewhere, into
// which it would write (set-aside/ is checked when an entry is set aside).
func TestOpenRefusesTopLevelSymlinks(t *testing.T) {
	for _, name := range []string{imagesDir, tmpDir, partialDir, setAsideDir} {
		t.Run(name, func(t *testing.T) {
			dir, elsewhere := t.TempDir(), t.TempDir()
			if name == setAsideDir {
				s := openStore(t, dir)
				e := put(t, s, []byte("an image"), "img.raw")
				s.Close()
				os.Remove(filepath.Join(dir, imagesDir, string(e.SHA256), MetadataName))
			}
			if err := os.Symlink(elsewhere, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			_, err := Open(dir)
			if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, name)+" is a symlink to "+elsewhere) || !strings.Contains(err.Error(), "move it away") {
				t.Fatalf("Open = %v, want a refusal naming the symlink and what to do", err)
			}
			if des, _ := os.ReadDir(elsewhere); len(des) != 0 {
				t.Errorf("the store wrote through the symlink: %v", entries(elsewhere))
			}
		})
	}
}

// A data directory that names a file is told as such, with its fix, not
// blamed on permissions.
func TestOpenSaysTheDataDirectoryIsAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "images.img")
	if err := os.WriteFile(file, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ dir, want string }{
		{file, file + " is a regular file, not a directory: give the data directory"},
		{filepath.Join(file, "data"), "a parent of it is a file, not a directory"},
	} {
		_, err := Open(tc.dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "writable") {
			t.Errorf("Open(%s) = %v; want %q, and no word of writability", tc.dir, err, tc.want)
		}
	}
}
