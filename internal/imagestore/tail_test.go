package imagestore

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// A reader of the image in progress gets every byte written, waits for
// the next ones, and ends at the commit; trailing holes read as zeros.
func TestTailFollowsTheWriteToTheCommit(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sum := strings.Repeat("a", 64)
	w, err := s.Create(osimage.SHA256(sum))
	if err != nil {
		t.Fatal(err)
	}
	data := append(bytes.Repeat([]byte("x"), 10000), make([]byte, 3*holeBlock)...)
	tail, err := w.Tail(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Close()
	got := make(chan []byte)
	go func() {
		b, err := io.ReadAll(tail)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	for i := 0; i < len(data); i += 4096 {
		if _, err := w.Write(data[i:min(i+4096, len(data))]); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-got:
		t.Fatal("the reader ended before the commit")
	case <-time.After(50 * time.Millisecond):
	}
	if err := w.Commit(Entry{Filename: "img.raw"}); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, data[100:]) {
		t.Fatalf("read %d bytes, want the %d written from offset 100", len(b), len(data)-100)
	}
}

// Abandoned or started again: the reader fails, since the bytes it read
// belong to a copy that will not be committed.
func TestTailFailsWhenTheWriteIsAbandonedOrReset(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, end := range []string{"abort", "reset"} {
		w, err := s.Create(osimage.SHA256(strings.Repeat("b", 64)))
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("hello"))
		tail, err := w.Tail(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if end == "abort" {
			w.Abort()
		} else {
			w.Reset()
		}
		if _, err := io.ReadAll(tail); err == nil {
			t.Errorf("%s: the reader ended without an error", end)
		}
		tail.Close()
		w.Abort()
	}
}
