package imagestore

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// TestBlobKeptBesideTheDownloadAndRemovedAtTheEnd: a blob kept (KeepBlob)
// is tailed while written, read to its end after the commit, never stored
// with the image; it is started again by a Reset and fails its readers at
// an Abort; without KeepBlob nothing is kept.
func TestBlobKeptBesideTheDownloadAndRemovedAtTheEnd(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sum := strings.Repeat("c", 64)

	w, err := s.Create(osimage.SHA256(sum))
	if err != nil {
		t.Fatal(err)
	}
	if bw, err := w.BlobWriter("sha256:x", 10); err != nil || bw != nil {
		t.Fatalf("without KeepBlob: writer %v, %v; want none", bw, err)
	}
	if _, err := w.TailBlob(context.Background(), 0); err == nil {
		t.Fatal("TailBlob without a blob kept: want an error")
	}
	w.Abort()

	w, err = s.Create(osimage.SHA256(sum))
	if err != nil {
		t.Fatal(err)
	}
	w.KeepBlob()
	bw, err := w.BlobWriter("sha256:first", 5)
	if err != nil || bw == nil {
		t.Fatalf("BlobWriter: %v, %v", bw, err)
	}
	bw.Write([]byte("hel"))
	tail, err := w.TailBlob(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	// A Reset (the pull starts again from byte 0) fails the readers of
	// the first blob, and the next pass keeps a new one.
	if err := w.Reset(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(tail); err == nil {
		t.Error("a reader of a blob started again: want an error")
	}
	tail.Close()
	if _, ok := w.Blob(); ok {
		t.Error("a blob is announced after Reset, before the next pass keeps one")
	}
	bw, err = w.BlobWriter("sha256:second", 5)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := w.Blob(); !ok || b.Digest != "sha256:second" || b.Size != 5 {
		t.Errorf("Blob() = %+v, %v", b, ok)
	}
	tail, err = w.TailBlob(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Close()
	got := make(chan string)
	go func() {
		b, err := io.ReadAll(tail)
		if err != nil {
			t.Error(err)
		}
		got <- string(b)
	}()
	bw.Write([]byte("hello"))
	w.Write([]byte("image"))
	if err := w.Commit(Entry{Filename: "x.img"}); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != "ello" {
		t.Errorf("tail of the blob from 1: %q, want %q", g, "ello")
	}
	if _, ok := s.Get(osimage.SHA256(sum)); !ok {
		t.Fatal("not committed")
	}
	filepath.WalkDir(s.Dir(), func(path string, de os.DirEntry, err error) error {
		if err == nil && de.Name() == blobName {
			t.Errorf("the blob was left in the store: %s", path)
		}
		return nil
	})

	// Abort fails the readers.
	w, err = s.Create(osimage.SHA256(strings.Repeat("d", 64)))
	if err != nil {
		t.Fatal(err)
	}
	w.KeepBlob()
	bw, _ = w.BlobWriter("", 5)
	bw.Write([]byte("ab"))
	tail2, err := w.TailBlob(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tail2.Close()
	w.Abort()
	if _, err := io.ReadAll(tail2); err == nil {
		t.Error("a reader of an abandoned blob: want an error")
	}
}
