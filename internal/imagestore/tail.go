package imagestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// tailState is what a Writer tells the readers of its image in progress:
// how far it was written, and how the writing ended.
type tailState struct {
	mu      sync.Mutex
	written int64
	ended   bool
	err     error         // why the writing ended short of a commit
	wake    chan struct{} // closed at each change, then replaced
}

func (t *tailState) waitChan() chan struct{} {
	if t.wake == nil {
		t.wake = make(chan struct{})
	}
	return t.wake
}

func (t *tailState) broadcastLocked() {
	if t.wake != nil {
		close(t.wake)
		t.wake = nil
	}
}

func (t *tailState) advance(off int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.written = off
	t.broadcastLocked()
}

// end stops the readers: at their end of file when err is nil (the image
// was committed), with err otherwise.
func (t *tailState) end(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.ended, t.err = true, err
	t.broadcastLocked()
}

// Tail opens a reader of the image as it is being written, from offset
// from: a Read waits for bytes not written yet, returns io.EOF once the
// image is committed and read to its end, and an error once the writing
// was abandoned or started again from byte 0 (the bytes read so far may
// then belong to a copy that will never be committed). The bytes are not
// verified: whoever reads them must verify the whole stream itself. Close
// the reader when done. Tail is safe to call while another goroutine
// writes.
func (w *Writer) Tail(ctx context.Context, from int64) (io.ReadCloser, error) {
	f, err := openRegular(filepath.Join(w.dir, partialName))
	if err != nil {
		return nil, fmt.Errorf("image %s: reading the download in progress: %w", w.sha256, err)
	}
	return &tailReader{ctx: ctx, t: w.currentTail(), f: f, off: from}, nil
}

// TailBlob opens a reader of the blob kept beside the image (KeepBlob), as
// Tail does for the image: it waits for bytes not written yet, ends at
// io.EOF once the blob was written whole and the image committed, and with
// an error when the download was abandoned or started again. It fails when
// no blob is kept.
func (w *Writer) TailBlob(ctx context.Context, from int64) (io.ReadCloser, error) {
	w.tailMu.Lock()
	b := w.blob
	w.tailMu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("image %s: no blob is kept beside the download", w.sha256)
	}
	f, err := openRegular(b.path)
	if err != nil {
		return nil, fmt.Errorf("image %s: reading the blob in progress: %w", w.sha256, err)
	}
	b.mu.Lock()
	t := b.tail
	b.mu.Unlock()
	return &tailReader{ctx: ctx, t: t, f: f, off: from}, nil
}

func (w *Writer) currentTail() *tailState {
	w.tailMu.Lock()
	defer w.tailMu.Unlock()
	return w.tail
}

type tailReader struct {
	ctx context.Context
	t   *tailState
	f   *os.File
	off int64
}

func (r *tailReader) Read(p []byte) (int, error) {
	for {
		r.t.mu.Lock()
		written, ended, err := r.t.written, r.t.ended, r.t.err
		var wake chan struct{}
		if !ended && r.off >= written {
			wake = r.t.waitChan()
		}
		r.t.mu.Unlock()
		if ended && err != nil {
			return 0, err
		}
		if r.off < written {
			n := min(int64(len(p)), written-r.off)
			got, rerr := r.f.ReadAt(p[:n], r.off)
			if rerr != nil && !errors.Is(rerr, io.EOF) {
				return got, rerr
			}
			// Trailing blocks of zeros are holes past the file's length
			// until the commit sets it: they read as zeros.
			clear(p[got:n])
			r.off += n
			return int(n), nil
		}
		if ended {
			return 0, io.EOF
		}
		select {
		case <-wake:
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		}
	}
}

func (r *tailReader) Close() error { return r.f.Close() }
