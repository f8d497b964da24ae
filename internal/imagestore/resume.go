package imagestore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Resumable downloads. A download started with Store.Resume lives in
// partial/<sha256>/ rather than in tmp/, so that Open keeps it: the image
// file in progress, the compressed blob when the source is compressed, and
// a checkpoint. The checkpoint records how many network bytes (the blob's,
// or the image's for a raw source) are durable and their sha256. Nothing in
// it is trusted: the puller reads the kept bytes again and compares their
// sha256 before it asks the network for the rest, so a partial file damaged
// while the server was down is detected and discarded.

const (
	partialDir = "partial"
	// checkpointName is the checkpoint of a resumable download, beside
	// its image in progress.
	checkpointName = ".checkpoint.json"
)

// checkpoint is what checkpointName holds.
type checkpoint struct {
	// Source names what the kept bytes are a prefix of (the puller's
	// identity of the download: a blob digest, say).
	Source string `json:"source"`
	// Offset is the number of network bytes kept, durable.
	Offset int64 `json:"offset"`
	// SHA256 is the hex sha256 of those bytes.
	SHA256 string `json:"sha256"`
	// InBlob says the bytes are the kept blob's (a compressed source),
	// not the image file's.
	InBlob bool `json:"inBlob,omitempty"`
}

// Resume opens the download of sha256 that an earlier Writer from Resume
// left (suspended at a shutdown, cut by a crash or a failure), or starts
// one. The Writer is used as one from Create; Kept and Checkpoint make it
// continue across restarts, and Suspend leaves it for the next Resume. Only
// one Writer from Resume may be open per sha256.
func (s *Store) Resume(sha256 osimage.SHA256) (*Writer, error) {
	if err := named(sha256); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.resuming[sha256] {
		s.mu.Unlock()
		return nil, fmt.Errorf("image %s: a download is already in progress", sha256)
	}
	s.resuming[sha256] = true
	s.mu.Unlock()
	release := func() {
		s.mu.Lock()
		delete(s.resuming, sha256)
		s.mu.Unlock()
	}
	dir, err := s.partialDirOf(sha256)
	if err != nil {
		release()
		return nil, err
	}
	f, err := openOwned(filepath.Join(dir, partialName), os.O_RDWR|os.O_CREATE)
	if err != nil {
		release()
		return nil, fmt.Errorf("image %s: %w", sha256, err)
	}
	w := &Writer{s: s, sha256: sha256, dir: dir, f: f, tail: &tailState{}, keepBlob: true, release: release}
	c, err := readCheckpoint(filepath.Join(dir, checkpointName))
	switch {
	case err == nil:
		w.kept = &c
	case errors.Is(err, fs.ErrNotExist):
	default:
		s.log.Warn("partial download discarded: its checkpoint cannot be read", "sha256", sha256, "path", dir, "reason", err.Error())
	}
	if w.kept == nil {
		// Whatever is there was never checkpointed: nothing vouches for it.
		if err := w.Reset(); err != nil {
			w.Abort()
			return nil, err
		}
	}
	return w, nil
}

// partialDirOf returns partial/<sha256>, made if missing. A download kept
// there holds only the files a Writer makes (partialFiles), each a regular
// file with one link. Anything else (a symlink, a FIFO, a device, a hard
// link, a stray file) was not left by the store: the directory is
// discarded whole, with a warning, before anything is read from it or
// written through it, and the download starts again from byte 0. Removing
// a symlink or a hard link removes that name only, never what it points to.
func (s *Store) partialDirOf(sha256 osimage.SHA256) (string, error) {
	dir := filepath.Join(s.partial, string(sha256))
	reason, err := notAPartial(dir)
	if err != nil {
		return "", fmt.Errorf("image %s: reading its partial download: %w", sha256, err)
	}
	if reason != "" {
		s.log.Warn("partial download discarded: it holds what the store did not make; nothing was read from it or written through it, and the download starts again from byte 0",
			"sha256", sha256, "path", dir, "reason", reason)
		if err := os.RemoveAll(dir); err != nil {
			return "", fmt.Errorf("image %s: removing the partial download %s (%s): %w; remove it by hand", sha256, dir, reason, err)
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("image %s: creating %s: %w", sha256, dir, err)
	}
	return dir, nil
}

// partialFiles are the names a Writer from Resume makes in its directory
// and may leave there.
var partialFiles = map[string]bool{partialName: true, blobName: true, checkpointName: true, checkpointName + ".new": true}

// notAPartial says how dir differs from a directory of partial/ the store
// left, or "" (a missing one included).
func notAPartial(dir string) (string, error) {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return fmt.Sprintf("%s is %s, not a directory", dir, describe(dir, fi)), nil
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, de := range des {
		path := filepath.Join(dir, de.Name())
		fi, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		if !partialFiles[de.Name()] {
			return fmt.Sprintf("%s is no file of a download (%s)", path, describe(path, fi)), nil
		}
		if what := checkOwned(path, fi); what != "" {
			return fmt.Sprintf("%s is %s", path, what), nil
		}
	}
	return "", nil
}

// maxCheckpointBytes bounds what is read of a checkpoint (a few hundred
// bytes as written).
const maxCheckpointBytes = 4 << 10

func readCheckpoint(path string) (checkpoint, error) {
	data, err := readRegular(path, maxCheckpointBytes)
	if err != nil {
		return checkpoint{}, err
	}
	var c checkpoint
	if err := json.Unmarshal(data, &c); err != nil {
		return checkpoint{}, err
	}
	if c.Offset < 0 || c.Source == "" {
		return checkpoint{}, fmt.Errorf("checkpoint with offset %d and source %q", c.Offset, c.Source)
	}
	return c, nil
}

// Kept prepares the writer to continue the download of source from its
// last checkpoint, and returns how many network bytes it keeps, their
// sha256 as checkpointed, and a reader of them. The bytes are not verified:
// the caller must compare their sha256 before it relies on them, and Reset
// the writer when they differ. When nothing is kept for source (no
// checkpoint, or one of another source), the writer is reset and Kept
// returns 0 and a nil reader.
//
// For a raw source the image file is cut back to the checkpoint and written
// on from there; for a compressed one the blob is, and the image file is
// written again from byte 0 (the caller decompresses the kept blob again).
func (w *Writer) Kept(source string) (int64, string, io.ReadCloser, error) {
	if w.release == nil {
		return 0, "", nil, nil
	}
	w.tailMu.Lock()
	c := w.kept
	w.tailMu.Unlock()
	if c == nil || c.Source != source || c.Offset == 0 {
		return 0, "", nil, w.Reset()
	}
	name := partialName
	if c.InBlob {
		name = blobName
	}
	if !c.InBlob && w.limit > 0 && c.Offset > w.limit {
		// A checkpoint that parses but cannot be right, and is not worth
		// reading (an offset of a terabyte would be hashed for an hour).
		w.s.log.Warn("partial download discarded: its checkpoint cannot be right", "sha256", w.sha256, "path", w.dir,
			"reason", fmt.Sprintf("it covers %d bytes of an image bounded to %d", c.Offset, w.limit))
		return 0, "", nil, w.Reset()
	}
	r, err := openRegular(filepath.Join(w.dir, name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// Lost: the caller's check of the sha256 reports it.
			return c.Offset, c.SHA256, io.NopCloser(strings.NewReader("")), nil
		}
		if isOddFile(err) {
			// Swapped since Resume checked the directory.
			w.s.log.Warn("partial download discarded: it holds what the store did not make; nothing was read from it", "sha256", w.sha256, "path", w.dir, "reason", err.Error())
			return 0, "", nil, w.Reset()
		}
		return 0, "", nil, fmt.Errorf("image %s: reading the kept download: %w", w.sha256, err)
	}
	// The writer may have written past the checkpoint already: an earlier
	// source of the same bytes failed (a peer that died), and the next
	// continues. Readers of the download in progress wait for the bytes
	// written again, which are the same.
	if c.InBlob {
		if err := w.f.Truncate(0); err != nil {
			r.Close()
			return 0, "", nil, fmt.Errorf("image %s: %w", w.sha256, err)
		}
		w.off, w.writtenOut = 0, 0
		w.blobFrom = c.Offset
	} else {
		// Trailing zeros were skipped as holes: the length is set here.
		if err := w.f.Truncate(c.Offset); err != nil {
			r.Close()
			return 0, "", nil, fmt.Errorf("image %s: %w", w.sha256, err)
		}
		w.off, w.writtenOut = c.Offset, c.Offset
	}
	w.err = nil
	w.currentTail().advance(w.off)
	return c.Offset, c.SHA256, &sectionReadCloser{io.NewSectionReader(r, 0, c.Offset), r}, nil
}

type sectionReadCloser struct {
	*io.SectionReader
	f *os.File
}

func (r *sectionReadCloser) Close() error { return r.f.Close() }

// Checkpoint records the first offset network bytes of the download of
// source, with their sha256, as the point a later Resume continues from.
// The network bytes are the blob's when one is kept (BlobWriter was
// called), the image file's otherwise. It is safe to call while another
// goroutine writes; the caller must not call it once it has called Commit,
// Abort, Suspend or Reset.
//
// Nothing is synced: what a killed process wrote stays in the page cache,
// which is what a checkpoint must survive (a rollout, an eviction, an OOM
// kill). After a power loss the bytes may be missing under a checkpoint
// that says otherwise, and the caller's check of their sha256 discards
// them. Syncing them at each checkpoint made checkpoints lag on a busy
// disk: a SIGKILL then lost 51 MB instead of at most 11 MiB.
//
// A writer from Create keeps nothing: Checkpoint does nothing.
func (w *Writer) Checkpoint(source string, offset int64, sha256 string) error {
	if w.release == nil {
		// From Create: nothing outlives the writer.
		return nil
	}
	w.tailMu.Lock()
	inBlob := w.blob != nil
	w.tailMu.Unlock()
	data, err := json.Marshal(checkpoint{Source: source, Offset: offset, SHA256: sha256, InBlob: inBlob})
	if err != nil {
		return err
	}
	path := filepath.Join(w.dir, checkpointName)
	tmp := path + ".new"
	if err := writeNew(tmp, append(data, '\n')); err != nil {
		return fmt.Errorf("image %s: writing the checkpoint: %w", w.sha256, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("image %s: writing the checkpoint: %w", w.sha256, err)
	}
	// A next pull into this writer (another source of the same bytes,
	// after this one failed) continues from here, as a next process would.
	w.tailMu.Lock()
	w.kept = &checkpoint{Source: source, Offset: offset, SHA256: sha256, InBlob: inBlob}
	w.tailMu.Unlock()
	return nil
}

// Checkpointed says whether a checkpoint of this writer's download is
// kept, which the next pull into it may continue from (Kept).
func (w *Writer) Checkpointed() bool {
	w.tailMu.Lock()
	defer w.tailMu.Unlock()
	return w.kept != nil && w.kept.Offset > 0
}

// Suspend ends the writer and keeps what it wrote, up to its last
// checkpoint, for the next Resume of the same sha256 (at a shutdown, say).
// Readers of the download in progress get an error. A writer not from
// Resume is aborted.
func (w *Writer) Suspend() error {
	if w.release == nil {
		return w.Abort()
	}
	if w.done {
		return nil
	}
	w.done = true
	stopped := errors.New("the download was suspended")
	w.currentTail().end(stopped)
	if b := w.detachBlob(); b != nil {
		b.close(stopped)
	}
	var err error
	if w.f != nil {
		err = w.f.Close()
		w.f = nil
	}
	w.release()
	return err
}

// dropCheckpoint removes the checkpoint: what is kept is no longer a
// prefix anything continues from.
func (w *Writer) dropCheckpoint() error {
	w.tailMu.Lock()
	w.kept = nil
	w.tailMu.Unlock()
	w.blobFrom = 0
	if w.release == nil {
		return nil
	}
	if err := os.Remove(filepath.Join(w.dir, checkpointName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image %s: removing the checkpoint: %w", w.sha256, err)
	}
	return nil
}

// Partial is a download kept in partial/ by a Writer from Resume.
type Partial struct {
	SHA256 osimage.SHA256
	// Bytes is the disk space its files take.
	Bytes int64
}

// Partials lists the downloads kept for a later Resume, open ones included.
func (s *Store) Partials() ([]Partial, error) {
	des, err := os.ReadDir(s.partial)
	if err != nil {
		return nil, fmt.Errorf("image store: reading %s: %w", s.partial, err)
	}
	var out []Partial
	for _, de := range des {
		sha, err := osimage.ParseSHA256(de.Name())
		if err != nil || !de.IsDir() {
			continue
		}
		out = append(out, Partial{SHA256: sha, Bytes: diskUsage(filepath.Join(s.partial, de.Name()))})
	}
	return out, nil
}

// RemovePartial removes the download of sha256 kept for a later Resume,
// unless a Writer has it open.
func (s *Store) RemovePartial(sha256 osimage.SHA256) error {
	if err := named(sha256); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resuming[sha256] {
		return fmt.Errorf("image %s: its download is in progress", sha256)
	}
	if err := os.RemoveAll(filepath.Join(s.partial, string(sha256))); err != nil {
		return fmt.Errorf("image %s: removing its partial download: %w", sha256, err)
	}
	return nil
}

// cleanPartials removes, at Open, the kept downloads of images that are
// committed already.
func (s *Store) cleanPartials() error {
	des, err := os.ReadDir(s.partial)
	if err != nil {
		return fmt.Errorf("image store: reading %s: %w", s.partial, err)
	}
	for _, de := range des {
		sha, err := osimage.ParseSHA256(de.Name())
		if _, committed := s.entries[sha]; err == nil && committed {
			if err := os.RemoveAll(filepath.Join(s.partial, de.Name())); err != nil {
				return fmt.Errorf("image store: removing %s: %w", filepath.Join(s.partial, de.Name()), err)
			}
		}
	}
	return nil
}
