package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestShutdownIsBoundedWhateverTheServerReads: once the context ends, Run's
// shutdown returns within its deadline even when the server is blocked in a
// read that never returns (here, an open of a real FIFO nobody writes to);
// a server that ends in time has its own error returned.
func TestShutdownIsBoundedWhateverTheServerReads(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	blocked := make(chan struct{})
	returned := make(chan error, 1)
	go func() {
		returned <- boundShutdown(ctx, 100*time.Millisecond, func() error {
			close(blocked)
			f, err := os.Open(fifo) // blocks until a writer comes
			if err == nil {
				f.Close()
			}
			return err
		})
	}()
	<-blocked
	cancel()
	select {
	case err := <-returned:
		if err == nil || !strings.Contains(err.Error(), "did not finish within 100ms") {
			t.Errorf("shutdown of a blocked server: %v, want an error naming the deadline", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the shutdown waited for a read that never returns")
	}
	// Let the reader go.
	if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		w.Close()
	}

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	want := errors.New("the server's own error")
	if err := boundShutdown(ctx, time.Minute, func() error { <-ctx.Done(); return want }); err != want {
		t.Errorf("shutdown of a server that ends: %v, want its error", err)
	}
}
