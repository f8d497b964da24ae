package imagestore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// The scan at Open: every directory of images/ is loaded and checked; one
// that is not a committed entry the store made is set aside, not served.

func (s *Store) scan() error {
	des, err := os.ReadDir(s.images)
	if err != nil {
		return fmt.Errorf("image store: reading %s: %w", s.images, err)
	}
	for _, de := range des {
		name := de.Name()
		// Only names this package makes are touched; anything else an
		// operator put there is neither listed nor removed.
		sha, err := osimage.ParseSHA256(name)
		if err != nil {
			continue
		}
		e, err := s.load(sha, de)
		var invalid *invalidEntry
		if errors.As(err, &invalid) && invalid.setAside {
			if err := s.setAside(sha, invalid.reason); err != nil {
				return err
			}
			continue
		}
		if errors.As(err, &invalid) {
			// Not a committed entry: a half-made directory (written by hand,
			// or by a crashed older layout), or a committed one tampered
			// with. Remove it so that a download can commit there.
			if err := os.RemoveAll(filepath.Join(s.images, name)); err != nil {
				return fmt.Errorf("image store: removing the invalid entry %s (%v): %w", filepath.Join(s.images, name), invalid, err)
			}
			s.log.Warn("stored image dropped: it is not what the store committed (tampered with, or written by hand); it will be downloaded again if selected",
				"sha256", name, "path", filepath.Join(s.images, name), "reason", invalid.reason)
			continue
		}
		if err != nil {
			// An I/O error says nothing about the entry: keep it on disk
			// rather than delete a good image.
			return fmt.Errorf("image store: reading the entry %s: %w", filepath.Join(s.images, name), err)
		}
		s.entries[sha] = e
	}
	return nil
}

// invalidEntry says why a directory of images/ is not a committed entry,
// and whether to set it aside rather than remove it.
type invalidEntry struct {
	reason string
	// setAside: the metadata is at fault, and the directory holds a file
	// that may be the verified image: nothing tells it is not.
	setAside bool
}

func (e *invalidEntry) Error() string { return e.reason }

func invalidf(format string, args ...any) error {
	return &invalidEntry{reason: fmt.Sprintf(format, args...)}
}

// load reads and checks the entry in images/<sha>. What a Commit cannot have
// made is an *invalidEntry; other errors are I/O errors.
func (s *Store) load(sha osimage.SHA256, de fs.DirEntry) (Entry, error) {
	if !de.IsDir() {
		return Entry{}, invalidf("not a directory")
	}
	dir := filepath.Join(s.images, string(sha))
	data, err := readRegular(filepath.Join(dir, MetadataName), maxMetadataBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Entry{}, badMetadata(dir, "no metadata")
	case isOddFile(err):
		return Entry{}, badMetadata(dir, "metadata: "+err.Error())
	case err != nil:
		return Entry{}, err
	}
	var e Entry
	if err := json.Unmarshal(data, &e); err != nil {
		return Entry{}, badMetadata(dir, fmt.Sprintf("metadata: %v", err))
	}
	if e.SHA256 != sha {
		return Entry{}, badMetadata(dir, fmt.Sprintf("metadata names sha256 %s", e.SHA256))
	}
	if err := osimage.ValidateFilename(e.Filename); err != nil {
		return Entry{}, badMetadata(dir, fmt.Sprintf("metadata: %v", err))
	}
	fi, err := os.Lstat(filepath.Join(dir, e.Filename))
	if errors.Is(err, fs.ErrNotExist) {
		return Entry{}, invalidf("no image file %s", e.Filename)
	}
	if err != nil {
		return Entry{}, err
	}
	if reason := notCommitted(filepath.Join(dir, e.Filename), fi, e); reason != "" {
		return Entry{}, invalidf("%s", reason)
	}
	return e, nil
}

// badMetadata is the *invalidEntry of the directory dir of images/ whose
// metadata is at fault for reason: set aside when it holds a regular file
// besides the metadata (which may be the verified image), removed when
// there is nothing to lose.
func badMetadata(dir, reason string) error {
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		if de.Name() != MetadataName && de.Type().IsRegular() {
			return &invalidEntry{reason: reason, setAside: true}
		}
	}
	return &invalidEntry{reason: reason}
}

// setAside moves the entry images/<sha> into set-aside/, not served and
// not deleted: its metadata cannot be trusted, but nothing says its bytes
// are not the verified image. The image is downloaded again if selected.
func (s *Store) setAside(sha osimage.SHA256, reason string) error {
	src := filepath.Join(s.images, string(sha))
	aside := filepath.Join(s.dir, setAsideDir)
	if err := makeOwnDir(aside); err != nil {
		return fmt.Errorf("setting aside %s (%s): %w", src, reason, err)
	}
	// A name of its own: nothing set aside earlier is touched.
	base := filepath.Join(aside, string(sha)+"-"+time.Now().UTC().Format("20060102T150405Z"))
	dst := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
			break
		}
		dst = fmt.Sprintf("%s-%d", base, i)
	}
	if err := os.Rename(src, dst); err != nil {
		return fmt.Errorf("image store: setting aside %s (%s): %w", src, reason, err)
	}
	s.log.Warn("stored image set aside: its metadata is not what the store wrote, so its bytes are neither served nor deleted; it will be downloaded again if selected. Check the directory, then delete it to free its space",
		"sha256", sha, "path", dst, "from", src, "reason", reason)
	return nil
}

// reportSetAside reminds, at each Open, of the entries set aside that are
// still there: they take disk space until an operator removes them.
func (s *Store) reportSetAside() {
	aside := filepath.Join(s.dir, setAsideDir)
	des, err := os.ReadDir(aside)
	if err != nil || len(des) == 0 {
		return
	}
	names := make([]string, 0, len(des))
	for _, de := range des {
		names = append(names, de.Name())
	}
	s.log.Warn("the data directory holds stored images set aside (their metadata was not what the store wrote); they are not served. Check them, then delete them to free their space",
		"path", aside, "entries", names)
}

// notCommitted says how fi, the image file of e at path, differs from
// what a Commit makes, or "".
func notCommitted(path string, fi fs.FileInfo, e Entry) string {
	switch {
	case !fi.Mode().IsRegular():
		return notRegular(e, describe(path, fi))
	case fi.Size() != e.Size:
		return fmt.Sprintf("image file %s has %d bytes, not the %d committed", e.Filename, fi.Size(), e.Size)
	}
	return ""
}

// notRegular is the reason an image file that is what (an *oddFile's
// what) is dropped.
func notRegular(e Entry, what string) string {
	return fmt.Sprintf("image file %s is not a regular file (%s)", e.Filename, what)
}
