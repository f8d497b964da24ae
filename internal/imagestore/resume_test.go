package imagestore

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if err := w.Checkpoint("src", 6, shaOf(content[:6])); err != nil {
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
	if off != 6 || sum != shaOf(content[:6]) || string(data) != "abcdef" || w.Size() != 6 {
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
	w.Checkpoint("mirror-a", 5, shaOf([]byte("12345")))
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
	if err := w.Checkpoint("blob sha256:x", 3, shaOf([]byte("BLO"))); err != nil {
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
	blob, _ := os.ReadFile(filepath.Join(dir, partialDir, sha, blobName))
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
	w.Checkpoint("src", 2, shaOf([]byte("bb")))
	w.Suspend()
	if err := os.WriteFile(filepath.Join(dir, partialDir, b, checkpointName), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, sha := range []string{a, b} {
		w, _ := s.Resume(sha)
		if off, _, _ := kept(t, w, "src"); off != 0 || w.Size() != 0 {
			t.Errorf("%s: kept %d bytes", sha, off)
		}
		if fi, err := os.Stat(filepath.Join(dir, partialDir, sha, partialName)); err != nil || fi.Size() != 0 {
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
	if left := entries(filepath.Join(dir, partialDir)); len(left) != 1 || left[0] != b {
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
	w.Checkpoint("src", 1<<40, shaOf([]byte("bounded")))
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
