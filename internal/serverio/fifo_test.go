//go:build unix

package serverio

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFilePublisherPublishedDoesNotHangOnAFIFO: a FIFO where the file
// should be is refused, naming the path, rather than read: reading it
// would wait for a writer forever, and the server reads the published
// set where it waits for nothing else (its readiness, a new leader's
// inherited count).
func TestFilePublisherPublishedDoesNotHangOnAFIFO(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "served.yaml")
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	p := FilePublisher{Path: path}
	done := make(chan error, 1)
	go func() {
		_, err := p.Published(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a regular file but a FIFO") {
			t.Errorf("reading a FIFO: %v, want an error naming %s and saying it is a FIFO", err, path)
		}
	case <-time.After(10 * time.Second):
		// Unblock the reader so that the test can end.
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("Published hangs on a FIFO")
	}
	// Publishing replaces it with the file.
	if err := p.Publish(ctx, output()); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Published(ctx); err != nil || len(got) != 2 {
		t.Errorf("after publishing over the FIFO: %v, %v", got, err)
	}
}

// TestFilePublisherPublishedIsBounded: a file larger than any the server
// writes is refused, naming the path, rather than read whole.
func TestFilePublisherPublishedIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "served.yaml")
	if err := os.WriteFile(path, []byte("capm3_os_image_server_images: {}\n"+strings.Repeat("#", 2<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := FilePublisher{Path: path}.Published(context.Background())
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("reading a 2 MiB file: %v, want an error naming %s and its size", err, path)
	}
}
