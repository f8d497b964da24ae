package imagestore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
)

const (
	// partialName is the image file while it is being written.
	partialName = ".partial"
	// holeBlock is the granularity of zero detection: the file system block.
	// Disk images are mostly zeros; skipping them leaves holes, which read as
	// zeros, cost no disk space and no write bandwidth (a 1 GiB image three
	// quarters empty is fsynced in a quarter of the time).
	holeBlock = 4096
	// writebackEvery starts the kernel's writeback of what was written every
	// so many bytes, so that the disk works during the download and the
	// final fsync has little left to do.
	writebackEvery = 16 << 20
)

var zeroBlock [holeBlock]byte

// ErrLimit is returned (wrapped) by a Write that would take the image past
// the limit set with Writer.SetLimit.
var ErrLimit = errors.New("the image is larger than the bound set for it")

// Writer writes one image into the store. It is not safe for concurrent use.
// It implements io.Writer; Reset starts over, Commit publishes, Abort
// discards.
type Writer struct {
	s      *Store
	sha256 osimage.SHA256
	dir    string
	f      *os.File

	off        int64 // bytes written (holes included)
	writtenOut int64 // offset up to which writeback was started
	limit      int64 // most bytes the image may have; 0 means no bound
	done       bool
	err        error

	// tail is what readers of the image in progress see (tail.go); Reset
	// replaces it, so tailMu guards the pointer.
	tailMu sync.Mutex
	tail   *tailState

	// keepBlob asks for the blob of the pull to be kept (blob.go), in
	// blob, guarded by tailMu.
	keepBlob bool
	blob     *blobFile

	// For a writer from Store.Resume (resume.go): release ends its claim
	// on the sha256; kept is the checkpoint it was opened with, and
	// blobFrom where the next BlobWriter continues the blob.
	release  func()
	kept     *checkpoint
	blobFrom int64
}

// Write appends p, leaving holes for the blocks of zeros.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.done {
		return 0, errors.New("image store: write after Commit or Abort")
	}
	if w.limit > 0 && int64(len(p)) > w.limit-w.off {
		// Nothing of p is written: the file never passes the bound.
		w.err = fmt.Errorf("image %s: %w: more than %d bytes", w.sha256, ErrLimit, w.limit)
		return 0, w.err
	}
	n := len(p)
	for len(p) > 0 {
		// Split at block boundaries of the file so that holes align with
		// the file system's blocks.
		first := int(holeBlock - w.off%holeBlock)
		if first > len(p) {
			first = len(p)
		}
		if bytes.Equal(p[:first], zeroBlock[:first]) {
			w.off += int64(first)
			p = p[first:]
			continue
		}
		// Gather the run of blocks holding data, and write it at once.
		end := first
		for end < len(p) {
			next := min(end+holeBlock, len(p))
			if bytes.Equal(p[end:next], zeroBlock[:next-end]) {
				break
			}
			end = next
		}
		if _, err := w.f.WriteAt(p[:end], w.off); err != nil {
			w.err = fmt.Errorf("image %s: writing %s: %w", w.sha256, w.f.Name(), err)
			return n - len(p), w.err
		}
		w.off += int64(end)
		p = p[end:]
	}
	w.currentTail().advance(w.off)
	if w.off-w.writtenOut >= writebackEvery {
		startWriteback(w.f, w.writtenOut, w.off-w.writtenOut)
		w.writtenOut = w.off
	}
	return n, nil
}

// SetLimit bounds the image to n bytes (n > 0): a Write that would pass
// the bound fails with ErrLimit and writes nothing, so that a decompression
// bomb, or a size that lies, can never take more disk space than was
// reserved for the image.
func (w *Writer) SetLimit(n int64) { w.limit = max(n, 0) }

// Size is the number of bytes written so far.
func (w *Writer) Size() int64 { return w.off }

// Reset discards what was written, to write the image again from its first
// byte.
func (w *Writer) Reset() error {
	if w.done {
		return errors.New("image store: Reset after Commit or Abort")
	}
	// The checkpoint goes first: a crash in between must not leave one
	// that describes bytes no longer there.
	if err := w.dropCheckpoint(); err != nil {
		w.err = err
		return err
	}
	if err := w.f.Truncate(0); err != nil {
		w.err = fmt.Errorf("image %s: truncating %s: %w", w.sha256, w.f.Name(), err)
		return w.err
	}
	w.off, w.writtenOut, w.err = 0, 0, nil
	w.tailMu.Lock()
	w.tail.end(errors.New("the image is being written again from its first byte"))
	w.tail = &tailState{}
	w.tailMu.Unlock()
	// The blob is started again by the puller's next BlobWriter call.
	w.endBlob(errors.New("the download is being started again from its first byte"))
	if w.release != nil {
		// One kept by an earlier process has no blobFile to end.
		if err := os.Remove(filepath.Join(w.dir, blobName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			w.err = fmt.Errorf("image %s: removing the kept blob: %w", w.sha256, err)
			return w.err
		}
	}
	return nil
}

// Commit makes the image durable and visible: it syncs the file, writes and
// syncs the metadata, and renames the staging directory into images/ in one
// step. e.SHA256 must be the sha256 given to Create (or empty); e.Size must
// be the bytes written (or 0); a zero VerifiedAt means now. Committing a
// sha256 that is already committed succeeds and keeps the existing entry.
// The caller is responsible for having verified the content.
func (w *Writer) Commit(e Entry) error {
	if w.done {
		return errors.New("image store: Commit after Commit or Abort")
	}
	if w.err != nil {
		return w.err
	}
	if e.SHA256 == "" {
		e.SHA256 = w.sha256
	}
	if e.SHA256 != w.sha256 {
		return fmt.Errorf("image store: committing sha256 %s into the writer created for %s", e.SHA256, w.sha256)
	}
	if err := osimage.ValidateFilename(e.Filename); err != nil {
		return fmt.Errorf("image %s: %w", w.sha256, err)
	}
	if e.Size == 0 {
		e.Size = w.off
	}
	if e.Size != w.off {
		return fmt.Errorf("image %s: committing %d bytes but %d were written", w.sha256, e.Size, w.off)
	}
	if e.VerifiedAt.IsZero() {
		e.VerifiedAt = time.Now()
	}
	e.VerifiedAt = e.VerifiedAt.UTC()
	e.MD5 = strings.ToLower(e.MD5)

	// The blob was written whole (the pull read it to its end): readers
	// read on to its end; it is not kept with the image.
	w.endBlob(nil)
	fail := func(what string, err error) error {
		w.Abort()
		return fmt.Errorf("image %s: %s: %w", w.sha256, what, err)
	}
	if err := w.dropCheckpoint(); err != nil {
		return fail("committing", err)
	}
	// Trailing zeros were skipped: set the length.
	if err := w.f.Truncate(w.off); err != nil {
		return fail("setting the file length", err)
	}
	if err := w.f.Sync(); err != nil {
		return fail("syncing the image file", err)
	}
	if err := w.f.Close(); err != nil {
		return fail("closing the image file", err)
	}
	w.f = nil
	if err := os.Rename(filepath.Join(w.dir, partialName), filepath.Join(w.dir, e.Filename)); err != nil {
		return fail("naming the image file", err)
	}
	meta, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return fail("encoding metadata", err)
	}
	if err := writeSynced(filepath.Join(w.dir, MetadataName), append(meta, '\n')); err != nil {
		return fail("writing metadata", err)
	}
	if err := syncDir(w.dir); err != nil {
		return fail("syncing the staging directory", err)
	}
	if err := w.s.commit(w.dir, e); err != nil {
		w.Abort()
		return err
	}
	w.done = true
	w.currentTail().end(nil)
	if w.release != nil {
		w.release()
	}
	return nil
}

// Abort discards the image. It is a no-op after Commit, so that it can be
// deferred.
func (w *Writer) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	w.currentTail().end(errors.New("the download was abandoned"))
	w.endBlob(errors.New("the download was abandoned"))
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	err := os.RemoveAll(w.dir)
	if w.release != nil {
		w.release()
	}
	if err != nil {
		return fmt.Errorf("image %s: removing the staging directory: %w", w.sha256, err)
	}
	return nil
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
