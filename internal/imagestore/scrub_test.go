package imagestore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func noThrottle(context.Context, int) error { return nil }

// TestScrubRecordsAndSurvivesRestart: a clean scrub is written beside the
// image, and read back by the next Open, so that a restart knows what is
// due.
func TestScrubRecordsAndSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	content := bytes.Repeat([]byte("osimages scrub "), 300_000) // > 4 chunks
	e := put(t, s, content, "disk.raw")
	var asked int
	got, err := s.Scrub(t.Context(), e.SHA256, func(_ context.Context, n int) error {
		if n > ScrubChunk {
			t.Errorf("throttle asked for %d bytes, more than a chunk", n)
		}
		asked += n
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.ScrubbedAt.IsZero() || !got.CheckedAt().Equal(got.ScrubbedAt) || !got.VerifiedAt.Equal(e.VerifiedAt) {
		t.Fatalf("after a clean scrub: %+v", got)
	}
	if asked != len(content) {
		t.Errorf("the throttle was asked for %d bytes, not the %d read", asked, len(content))
	}
	s.Close()
	s2 := openStore(t, dir)
	again, ok := s2.Get(e.SHA256)
	if !ok || !again.ScrubbedAt.Equal(got.ScrubbedAt) {
		t.Fatalf("after a restart: %+v, %v; want scrubbedAt %s", again, ok, got.ScrubbedAt)
	}
	if b := readAll(t, s2, e.SHA256); !bytes.Equal(b, content) {
		t.Fatal("the image changed")
	}
	if left := entries(filepath.Join(dir, tmpDir)); len(left) != 0 {
		t.Errorf("tmp/ holds %v", left)
	}
}

// TestScrubDropsAFlippedByte: one byte flipped in place (same size, same
// inode, what a bad disk does) is found, and the entry is dropped.
func TestScrubDropsAFlippedByte(t *testing.T) {
	dir := t.TempDir()
	log := &logBuffer{}
	s, err := Open(dir, WithLogger(slog.New(slog.NewJSONHandler(log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	content := bytes.Repeat([]byte{7}, 3*ScrubChunk+5)
	e := put(t, s, content, "disk.raw")
	flipByte(t, filepath.Join(dir, imagesDir, string(e.SHA256), e.Filename), int64(len(content)-1))
	f, _, err := s.Open(e.SHA256)
	if err != nil {
		t.Fatalf("a flipped byte is not seen by Open (same size): %v", err)
	}
	f.Close()
	_, err = s.Scrub(t.Context(), e.SHA256, noThrottle, nil)
	if !errors.Is(err, ErrTampered) {
		t.Fatalf("scrub of a flipped byte: %v, want ErrTampered", err)
	}
	if _, ok := s.Get(e.SHA256); ok {
		t.Error("the corrupt entry is still listed")
	}
	if _, err := os.Stat(filepath.Join(dir, imagesDir, string(e.SHA256))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the corrupt entry is still on disk: %v", err)
	}
	if line := grepLine(log.String(), "stored image dropped"); line == "" || !bytes.Contains([]byte(line), []byte("hashes to sha256")) {
		t.Errorf("no warning naming the mismatch in the log:\n%s", log.String())
	}
}

// TestScrubThrottleErrorKeepsTheEntry: a scrub cut short (shutdown)
// records nothing and drops nothing.
func TestScrubThrottleErrorKeepsTheEntry(t *testing.T) {
	s := openStore(t, t.TempDir())
	e := put(t, s, bytes.Repeat([]byte{1}, 2*ScrubChunk), "disk.raw")
	ctx, cancel := context.WithCancel(t.Context())
	calls := 0
	_, err := s.Scrub(ctx, e.SHA256, func(context.Context, int) error {
		calls++
		if calls == 2 {
			cancel()
			return context.Canceled
		}
		return nil
	}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if got, ok := s.Get(e.SHA256); !ok || !got.ScrubbedAt.IsZero() {
		t.Fatalf("after a cut scrub: %+v, %v", got, ok)
	}
}

// flipByte inverts the byte at off of path, in place.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
