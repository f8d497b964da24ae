package imagestore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// blobName is the compressed blob kept beside the image in progress.
const blobName = ".blob"

// Blob describes the blob (the compressed layer, as the registry sends it)
// a Writer keeps beside the image it writes.
type Blob struct {
	// Digest is the blob's OCI digest ("" when the source has none) and
	// Size its length (0 when unknown), as the registry's manifest
	// declares them.
	Digest string
	Size   int64
}

// blobFile is the side file that receives the network bytes of a pull, so
// that peers can stream the compressed layer instead of the (much larger)
// image. It is written by the pull's network goroutine, concurrently with
// the image, hence its own lock.
type blobFile struct {
	Blob
	path string

	mu   sync.Mutex
	f    *os.File
	off  int64
	err  error
	tail *tailState
}

// KeepBlob asks the writer to keep the blob of the pull that fills it,
// beside the image in progress, for peers to tail (TailBlob). The blob is
// removed at Commit and Abort: a verified image is copied whole.
func (w *Writer) KeepBlob() { w.keepBlob = true }

// BlobWriter is where the puller writes the network bytes of the blob
// (digest and size from the manifest); nil when KeepBlob was not asked. A
// second call (the pull started again from byte 0) starts the blob again.
func (w *Writer) BlobWriter(digest string, size int64) (io.Writer, error) {
	if !w.keepBlob || w.done {
		return nil, nil
	}
	w.tailMu.Lock()
	defer w.tailMu.Unlock()
	// After Kept, the blob goes on from the checkpoint; else from byte 0.
	from := w.blobFrom
	w.blobFrom = 0
	if b := w.blob; b != nil {
		if from > 0 && b.Digest == digest && b.Size == size {
			// The same blob, continued in this writer from another source
			// after the first failed: its readers read on.
			if err := b.rewind(from); err != nil {
				return nil, fmt.Errorf("image %s: keeping the blob: %w", w.sha256, err)
			}
			return b, nil
		}
		b.end(errors.New("the blob is being written again from its first byte"))
		w.blob = nil
	}
	path := filepath.Join(w.dir, blobName)
	f, err := openOwned(path, os.O_WRONLY|os.O_CREATE)
	if err == nil {
		err = f.Truncate(from)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		return nil, fmt.Errorf("image %s: keeping the blob: %w", w.sha256, err)
	}
	w.blob = &blobFile{Blob: Blob{Digest: digest, Size: size}, path: path, f: f, off: from, tail: &tailState{written: from}}
	return w.blob, nil
}

// Blob says which blob is kept beside the image in progress, if any.
func (w *Writer) Blob() (Blob, bool) {
	w.tailMu.Lock()
	defer w.tailMu.Unlock()
	if w.blob == nil {
		return Blob{}, false
	}
	return w.blob.Blob, true
}

func (b *blobFile) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if b.f == nil {
		return 0, errors.New("image store: blob written after it ended")
	}
	n, err := b.f.WriteAt(p, b.off)
	b.off += int64(n)
	if err != nil {
		b.err = fmt.Errorf("writing %s: %w", b.path, err)
		return n, b.err
	}
	b.tail.advance(b.off)
	return n, nil
}

// rewind takes the blob back to off, where the next write goes (the last
// checkpoint); readers past it wait for the bytes written again.
func (b *blobFile) rewind(off int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.f == nil {
		return errors.New("the blob ended")
	}
	if err := b.f.Truncate(off); err != nil {
		return err
	}
	b.off, b.err = off, nil
	b.tail.advance(off)
	return nil
}

// end closes and removes the blob; readers that opened it read on to what
// was written, then get err (io.EOF when nil).
func (b *blobFile) end(err error) {
	b.close(err)
	os.Remove(b.path)
}

// close ends the blob as end does, but keeps its file (for a later Resume).
func (b *blobFile) close(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tail.end(err)
	if b.f != nil {
		b.f.Close()
		b.f = nil
	}
}

// endBlob ends the blob kept, if any.
func (w *Writer) endBlob(err error) {
	if b := w.detachBlob(); b != nil {
		b.end(err)
	}
}

// detachBlob takes the blob kept, if any, from the writer.
func (w *Writer) detachBlob() *blobFile {
	w.tailMu.Lock()
	defer w.tailMu.Unlock()
	b := w.blob
	w.blob = nil
	return b
}
