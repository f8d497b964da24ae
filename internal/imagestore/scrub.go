package imagestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// ScrubChunk is the most a scrub reads at once: its memory, and the
// largest request it makes of its throttle.
const ScrubChunk = 1 << 20

// Scrub re-reads the committed image file of sha256 and checks that it
// still hashes to sha256 and has the committed size: a bit flipped on disk
// since the download is found here rather than by Ironic late in a deploy.
//
// throttle is called with the size of each read before it is made (at most
// ScrubChunk bytes, and the committed size in all); it paces the scrub, and its error ends it. No lock of
// the store is held while reading.
//
// A file that matches gets ScrubbedAt = now() (time.Now when nil: the clock
// that gave VerifiedAt) in its metadata (written
// atomically beside the image), and the updated Entry is returned. A file
// that does not is dropped at once, logged as tampered with, and the error
// wraps ErrTampered: the caller downloads it again. Any other error (I/O,
// the throttle's) leaves the entry as it is.
func (s *Store) Scrub(ctx context.Context, sha256sum osimage.SHA256, throttle func(ctx context.Context, n int) error, now func() time.Time) (Entry, error) {
	if now == nil {
		now = time.Now
	}
	f, e, err := s.Open(sha256sum)
	if err != nil {
		return Entry{}, err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, ScrubChunk)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return Entry{}, fmt.Errorf("scrubbing image %s: %w", sha256sum, err)
		}
		want := min(int64(len(buf)), e.Size-n)
		if want <= 0 {
			// Past the committed size: one byte more is a mismatch.
			m, _ := f.Read(buf[:1])
			n += int64(m)
			break
		}
		if err := throttle(ctx, int(want)); err != nil {
			return Entry{}, fmt.Errorf("scrubbing image %s: %w", sha256sum, err)
		}
		m, rerr := io.ReadFull(f, buf[:want])
		h.Write(buf[:m])
		n += int64(m)
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return Entry{}, fmt.Errorf("scrubbing image %s: reading %s: %w", sha256sum, f.Name(), rerr)
		}
	}
	got := hex.EncodeToString(h.Sum(nil))
	var reason string
	switch {
	case n != e.Size:
		reason = fmt.Sprintf("scrub: image file %s has %d bytes, not the %d committed", e.Filename, n, e.Size)
	case got != string(sha256sum):
		reason = fmt.Sprintf("scrub: the content of %s hashes to sha256 %s", e.Filename, got)
	}
	if reason != "" {
		if cur, ok := s.Get(sha256sum); !ok || !sameCommit(cur, e) {
			// Deleted, or deleted and committed again, while it was read:
			// what was read is not what is stored now.
			return Entry{}, fmt.Errorf("scrubbing image %s: the entry changed during the scrub", sha256sum)
		}
		return Entry{}, s.dropTampered(e, reason)
	}
	return s.markScrubbed(e, now())
}

// sameCommit says whether a and b are the same commit of an image (a scrub
// changes neither field).
func sameCommit(a, b Entry) bool {
	return a.SHA256 == b.SHA256 && a.Filename == b.Filename && a.VerifiedAt.Equal(b.VerifiedAt)
}

// markScrubbed records in the metadata of e that its content was found
// right at. The new metadata is written and synced in tmp/, then renamed
// over the old in one step: a crash leaves either, both valid.
func (s *Store) markScrubbed(e Entry, at time.Time) (Entry, error) {
	e.ScrubbedAt = at.UTC()
	meta, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return Entry{}, err
	}
	tmp, err := os.CreateTemp(s.tmp, "scrubbed-"+string(e.SHA256)+"-")
	if err != nil {
		return Entry{}, fmt.Errorf("image %s: recording its scrub: %w", e.SHA256, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(append(meta, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Entry{}, fmt.Errorf("image %s: recording its scrub: %w", e.SHA256, err)
	}
	dir := filepath.Join(s.images, string(e.SHA256))
	s.mu.Lock()
	if cur, ok := s.entries[e.SHA256]; !ok || !sameCommit(cur, e) {
		s.mu.Unlock()
		return Entry{}, fmt.Errorf("image %s: recording its scrub: %w", e.SHA256, errors.Join(ErrNotFound, errors.New("deleted during the scrub")))
	}
	err = os.Rename(tmp.Name(), filepath.Join(dir, MetadataName))
	if err == nil {
		s.entries[e.SHA256] = e
	}
	s.mu.Unlock()
	if err != nil {
		return Entry{}, fmt.Errorf("image %s: recording its scrub: %w", e.SHA256, err)
	}
	if err := syncDir(dir); err != nil {
		return Entry{}, fmt.Errorf("image %s: recording its scrub: syncing %s: %w", e.SHA256, dir, err)
	}
	return e, nil
}
