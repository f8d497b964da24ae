package imagestore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// kept calls Kept and reads what it returns.
func kept(t *testing.T, w *Writer, source string) (int64, string, []byte) {
	t.Helper()
	off, sum, r, err := w.Kept(source)
	if err != nil {
		t.Fatal(err)
	}
	if r == nil {
		return off, sum, nil
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return off, sum, data
}

// TestResumeKeepsWhatWasCheckpointed: a raw download checkpointed at 6
// bytes and suspended is found by the next store on the directory, cut back
// to the checkpoint, and continued to a commit; a checkpoint of another
// source keeps nothing.
func TestResumeKeepsWhatWasCheckpointed(t *testing.T) {
	dir := t.TempDir()
	content := []byte("abcdefghij")
	sha := shaOf(content)
	s := openStore(t, dir)
	w, err := s.Resume(sha)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resume(sha); err == nil || !strings.Contains(err.Error(), "already in progress") {
		t.Errorf("a second Resume of the same image: %v", err)
	}
	if err := s.RemovePartial(sha); err == nil {
		t.Error("RemovePartial removed a download in progress")
	}
	if off, _, data := kept(t, w, "src"); off != 0 || data != nil {
		t.Fatalf("a new download keeps %d bytes", off)
	}
	w.Write(content[:8])
	if err := w.Checkpoint("src", 6, string(shaOf(content[:6]))); err != nil {
		t.Fatal(err)
	}
	if err := w.Suspend(); err != nil {
		t.Fatal(err)
	}
	if ps, err := s.Partials(); err != nil || len(ps) != 1 || ps[0].SHA256 != sha {
		t.Fatalf("partials %v, %v", ps, err)
	}
	s.Close()

	s = openStore(t, dir)
	w, err = s.Resume(sha)
	if err != nil {
		t.Fatal(err)
	}
	off, sum, data := kept(t, w, "src")
	if off != 6 || osimage.SHA256(sum) != shaOf(content[:6]) || string(data) != "abcdef" || w.Size() != 6 {
		t.Fatalf("kept %d bytes %q of sha256 %s, writer at %d; want the 6 checkpointed", off, data, sum, w.Size())
	}
	w.Write(content[6:])
	if err := w.Commit(Entry{Filename: "x.raw"}); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s, sha); string(got) != string(content) {
		t.Fatalf("committed %q", got)
	}
	if left := entries(filepath.Join(dir, partialDir)); len(left) != 0 {
		t.Errorf("partial/ still holds %v after the commit", left)
	}

	// Another source: nothing kept, the file starts again.
	other := shaOf([]byte("other"))
	w, _ = s.Resume(other)
	w.Write([]byte("12345"))
	w.Checkpoint("mirror-a", 5, string(shaOf([]byte("12345"))))
	w.Suspend()
	w, _ = s.Resume(other)
	if off, _, data := kept(t, w, "mirror-b"); off != 0 || data != nil || w.Size() != 0 {
		t.Errorf("another source kept %d bytes, writer at %d", off, w.Size())
	}
	w.Abort()
	if left := entries(filepath.Join(dir, partialDir)); len(left) != 0 {
		t.Errorf("partial/ still holds %v after Abort", left)
	}
}

// TestResumeContinuesTheKeptBlob: for a compressed download the kept bytes
// are the blob's: Kept returns them, the image starts again from byte 0
// and the next BlobWriter appends where the checkpoint stood.
func TestResumeContinuesTheKeptBlob(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	sha := shaOf([]byte("image"))
	w, _ := s.Resume(sha)
	kept(t, w, "blob sha256:x")
	bw, err := w.BlobWriter("sha256:x", 8)
	if err != nil || bw == nil {
		t.Fatalf("blob writer %v, %v", bw, err)
	}
	bw.Write([]byte("BLOB"))
	w.Write([]byte("imagebytes"))
	if err := w.Checkpoint("blob sha256:x", 3, string(shaOf([]byte("BLO")))); err != nil {
		t.Fatal(err)
	}
	w.Suspend()
	s.Close()

	s = openStore(t, dir)
	w, _ = s.Resume(sha)
	off, _, data := kept(t, w, "blob sha256:x")
	if off != 3 || string(data) != "BLO" || w.Size() != 0 {
		t.Fatalf("kept %d bytes %q, image writer at %d; want the blob's 3 and the image from 0", off, data, w.Size())
	}
	bw, _ = w.BlobWriter("sha256:x", 8)
	bw.Write([]byte("B!"))
	blob, _ := os.ReadFile(filepath.Join(dir, partialDir, string(sha), blobName))
	if string(blob) != "BLOB!" {
		t.Errorf("blob %q, want the kept 3 bytes and the 2 written", blob)
	}
	w.Abort()
}

// TestResumeDiscardsWhatNoCheckpointVouchesFor: a partial without a
// checkpoint, or with one that does not parse, is emptied (loudly for the
// latter); the partial of an image committed meanwhile is removed at Open.
func TestResumeDiscardsWhatNoCheckpointVouchesFor(t *testing.T) {
	dir := t.TempDir()
	var logs logBuffer
	s, err := Open(dir, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	a, b := shaOf([]byte("a")), shaOf([]byte("b"))
	w, _ := s.Resume(a)
	w.Write([]byte("never checkpointed"))
	w.Suspend()
	w, _ = s.Resume(b)
	w.Write([]byte("bb"))
	w.Checkpoint("src", 2, string(shaOf([]byte("bb"))))
	w.Suspend()
	if err := os.WriteFile(filepath.Join(dir, partialDir, string(b), checkpointName), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, sha := range []osimage.SHA256{a, b} {
		w, _ := s.Resume(sha)
		if off, _, _ := kept(t, w, "src"); off != 0 || w.Size() != 0 {
			t.Errorf("%s: kept %d bytes", sha, off)
		}
		if fi, err := os.Stat(filepath.Join(dir, partialDir, string(sha), partialName)); err != nil || fi.Size() != 0 {
			t.Errorf("%s: the partial file is not emptied: %v", sha, err)
		}
		w.Suspend()
	}
	if !strings.Contains(logs.String(), "partial download discarded: its checkpoint cannot be read") {
		t.Errorf("the unreadable checkpoint was not logged:\n%s", logs.String())
	}
	s.Close()

	s = openStore(t, dir)
	put(t, s, []byte("a"), "a.raw")
	s.Close()
	s = openStore(t, dir)
	if left := entries(filepath.Join(dir, partialDir)); len(left) != 1 || osimage.SHA256(left[0]) != b {
		t.Errorf("partial/ holds %v, want only %s: a is committed", left, b)
	}
}

// TestResumeDiscardsAnOffsetPastTheBound: a raw checkpoint beyond the
// bound set on the image (it parses, it cannot be right) is not read: the
// writer starts again, loudly.
func TestResumeDiscardsAnOffsetPastTheBound(t *testing.T) {
	dir := t.TempDir()
	var logs logBuffer
	s, err := Open(dir, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sha := shaOf([]byte("bounded"))
	w, _ := s.Resume(sha)
	w.Write([]byte("bounded"))
	w.Checkpoint("src", 1<<40, string(shaOf([]byte("bounded"))))
	w.Suspend()
	w, _ = s.Resume(sha)
	defer w.Abort()
	w.SetLimit(1 << 20)
	if off, _, data := kept(t, w, "src"); off != 0 || data != nil || w.Size() != 0 {
		t.Errorf("kept %d bytes of a checkpoint past the bound", off)
	}
	if !strings.Contains(logs.String(), "it covers 1099511627776 bytes of an image bounded to 1048576") {
		t.Errorf("not logged:\n%s", logs.String())
	}
}

// suspended leaves in dir the download of content cut at cut and
// checkpointed there, as a shutdown does: raw (the image file is the
// network bytes) or, with blob, compressed (the blob is: here, content
// itself stands for the blob).
func suspended(t *testing.T, dir string, content []byte, cut int, blob bool) {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := s.Resume(shaOf(content))
	if err != nil {
		t.Fatal(err)
	}
	var out io.Writer = w
	if blob {
		bw, err := w.BlobWriter("sha256:"+string(shaOf(content)), int64(len(content)))
		if err != nil {
			t.Fatal(err)
		}
		out = bw
	}
	if _, err := out.Write(content[:cut]); err != nil {
		t.Fatal(err)
	}
	if err := w.Checkpoint("src", int64(cut), string(shaOf(content[:cut]))); err != nil {
		t.Fatal(err)
	}
	if err := w.Suspend(); err != nil {
		t.Fatal(err)
	}
}

// TestResumeRefusesWhatTheStoreDidNotMake: a FIFO, a device, a huge file,
// a symlink or a hard link planted in a kept download (or the download's
// directory itself a symlink) is never opened blocking, never read without
// bound, never written through: the partial download is discarded, with a
// warning naming the file, and the download starts again from byte 0 and
// commits. On today's main a FIFO blocked Resume (or the blob's writer) for
// ever, a huge checkpoint was read whole, and the resume truncated and
// overwrote the files the links pointed to, outside the data directory.
func TestResumeRefusesWhatTheStoreDidNotMake(t *testing.T) {
	content := devregistry.DiskContent(1<<20, 4)
	sha := shaOf(content)
	for _, tc := range []struct {
		name string
		blob bool
		// plant alters the kept download in pdir; victim is a file outside
		// the data directory, outside a directory there.
		plant func(t *testing.T, pdir, victim, outside string) (unblock func())
		what  string
	}{
		{"checkpoint fifo", false, func(t *testing.T, pdir, _, _ string) func() {
			return mkfifo(t, filepath.Join(pdir, checkpointName))
		}, "a FIFO"},
		{"partial fifo", false, func(t *testing.T, pdir, _, _ string) func() {
			return mkfifo(t, filepath.Join(pdir, partialName))
		}, "a FIFO"},
		{"blob fifo", true, func(t *testing.T, pdir, _, _ string) func() {
			return mkfifo(t, filepath.Join(pdir, blobName))
		}, "a FIFO"},
		{"checkpoint device", false, func(t *testing.T, pdir, _, _ string) func() {
			replaceBy(t, filepath.Join(pdir, checkpointName), func(p string) error { return os.Symlink("/dev/zero", p) })
			return nil
		}, "a symlink to /dev/zero"},
		{"checkpoint huge", false, func(t *testing.T, pdir, _, _ string) func() {
			if err := os.Truncate(filepath.Join(pdir, checkpointName), 256<<20); err != nil {
				t.Fatal(err)
			}
			return nil
		}, "larger than"},
		{"partial symlink", false, func(t *testing.T, pdir, victim, _ string) func() {
			replaceBy(t, filepath.Join(pdir, partialName), func(p string) error { return os.Symlink(victim, p) })
			return nil
		}, "a symlink to"},
		{"partial hard link", false, func(t *testing.T, pdir, victim, _ string) func() {
			replaceBy(t, filepath.Join(pdir, partialName), func(p string) error { return os.Link(victim, p) })
			return nil
		}, "2 links"},
		{"blob symlink", true, func(t *testing.T, pdir, victim, _ string) func() {
			replaceBy(t, filepath.Join(pdir, blobName), func(p string) error { return os.Symlink(victim, p) })
			return nil
		}, "a symlink to"},
		{"blob hard link", true, func(t *testing.T, pdir, victim, _ string) func() {
			replaceBy(t, filepath.Join(pdir, blobName), func(p string) error { return os.Link(victim, p) })
			return nil
		}, "2 links"},
		{"new checkpoint symlink", false, func(t *testing.T, pdir, victim, _ string) func() {
			if err := os.Symlink(victim, filepath.Join(pdir, checkpointName+".new")); err != nil {
				t.Fatal(err)
			}
			return nil
		}, "a symlink to"},
		{"directory symlink", false, func(t *testing.T, pdir, _, outside string) func() {
			replaceBy(t, pdir, func(p string) error { return os.Symlink(outside, p) })
			return nil
		}, "a symlink to"},
		{"stray file", false, func(t *testing.T, pdir, victim, _ string) func() {
			if err := os.Symlink(victim, filepath.Join(pdir, "img.raw")); err != nil {
				t.Fatal(err)
			}
			return nil
		}, "no file of a download"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			// The victim: a file that is not the store's, of the length and
			// content a kept download might have, so that only refusing it
			// keeps it whole.
			victim := filepath.Join(outside, "victim")
			victimContent := bytes.Repeat([]byte("not the store's file\n"), 10_000)
			if err := os.WriteFile(victim, victimContent, 0o644); err != nil {
				t.Fatal(err)
			}
			suspended(t, dir, content, len(content)/2, tc.blob)
			pdir := filepath.Join(dir, partialDir, string(sha))
			unblock := tc.plant(t, pdir, victim, outside)

			logs, withLogs := logged(t)
			s, err := Open(dir, withLogs)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var before, after runtime.MemStats
			var w *Writer
			var keptBytes int64
			within(t, "resuming with a "+tc.name, unblock, func() {
				runtime.ReadMemStats(&before)
				w, err = s.Resume(sha)
				if err != nil {
					return
				}
				runtime.ReadMemStats(&after)
				// As the puller goes on: what is kept, the blob, the bytes,
				// the checkpoints, the commit.
				var r io.ReadCloser
				keptBytes, _, r, err = w.Kept("src")
				if err != nil {
					return
				}
				if r != nil {
					r.Close()
				}
				if tc.blob {
					w.KeepBlob()
					var bw io.Writer
					if bw, err = w.BlobWriter("sha256:"+string(sha), int64(len(content))); err != nil {
						return
					}
					if _, err = bw.Write(content); err != nil {
						return
					}
				}
				if _, err = w.Write(content); err != nil {
					return
				}
				if err = w.Checkpoint("src", int64(len(content)), string(sha)); err != nil {
					return
				}
				err = w.Commit(Entry{Filename: "img.raw"})
			})
			if err != nil {
				t.Fatalf("resuming with a %s: %v", tc.name, err)
			}
			if keptBytes != 0 {
				t.Errorf("%d bytes kept from the planted download, want none", keptBytes)
			}
			t.Logf("Resume allocated %d KiB", (after.TotalAlloc-before.TotalAlloc)>>10)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("Resume allocated %d MiB: it read a planted file without bound", grew>>20)
			}
			if got := readAll(t, s, sha); !bytes.Equal(got, content) {
				t.Errorf("committed %d bytes, not the image", len(got))
			}
			if got, _ := os.ReadFile(victim); !bytes.Equal(got, victimContent) {
				t.Errorf("the file outside the data directory was written through: %d bytes, want %d untouched", len(got), len(victimContent))
			}
			if des, _ := os.ReadDir(outside); len(des) != 1 {
				t.Errorf("the directory outside the data directory holds %v, want only the victim", entries(outside))
			}
			line := grepLine(logs.String(), "partial download discarded")
			if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, string(sha)) || !strings.Contains(line, tc.what) {
				t.Errorf("log %q: want a warning naming the download and saying %q", logs.String(), tc.what)
			}
			if _, err := os.Lstat(pdir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s is still there after the commit: %v", pdir, err)
			}
		})
	}
}

// replaceBy removes path and makes something else there with mk.
func replaceBy(t *testing.T, path string, mk func(string) error) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	if err := mk(path); err != nil {
		t.Fatal(fmt.Errorf("planting at %s: %w", path, err))
	}
}
