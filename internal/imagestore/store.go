// Package imagestore keeps verified OS images on disk, addressed by the
// sha256 of their content.
//
// Layout under the data directory:
//
//	images/<sha256>/<filename>       the image file, as served
//	images/<sha256>/.osimages.json   its metadata (Entry)
//	tmp/                             staging directories and deleted entries
//	partial/<sha256>/                a resumable download (Store.Resume)
//	set-aside/<sha256>-<time>/       an entry whose metadata was not what
//	                                 the store wrote, bytes kept, not served
//
// An entry becomes visible in one rename of a complete, fsynced staging
// directory into images/, so a crash at any point leaves either a whole entry
// or nothing servable; whatever is left in tmp/ is removed by the next Open.
// A download in partial/ is kept across restarts, and never served.
package imagestore

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
)

const (
	imagesDir = "images"
	tmpDir    = "tmp"
	// setAsideDir keeps, for the operator to inspect, the entries of
	// images/ whose metadata is unreadable or wrong while their directory
	// holds a file that may be the verified image: they are not served
	// nor deleted.
	setAsideDir = "set-aside"
	lockFile    = ".lock"
	// MetadataName is the file of an entry's metadata, beside the image. It
	// is the one base name an image file cannot have.
	MetadataName = ".osimages.json"
	// maxMetadataBytes bounds what is read of a metadata file.
	maxMetadataBytes = 64 << 10
)

// ErrNotFound is returned (wrapped) for a sha256 with no committed entry.
var ErrNotFound = fs.ErrNotExist

// ErrTampered is returned (wrapped) by Open when the committed image file
// is no longer what was committed: replaced by a symlink or another kind of
// file, or of another size. The entry is dropped (and logged) at once; the
// image must be downloaded again.
var ErrTampered = errors.New("the stored image was tampered with")

// Entry is a committed, verified image.
type Entry struct {
	SHA256     osimage.SHA256 `json:"sha256"`
	MD5        string         `json:"md5,omitempty"`
	Filename   string         `json:"filename"`
	Size       int64          `json:"size"`
	VerifiedAt time.Time      `json:"verifiedAt"`
	// ScrubbedAt is when a scrub last re-read the file and found it
	// matching its sha256 (zero before the first).
	ScrubbedAt time.Time `json:"scrubbedAt,omitzero"`
}

// CheckedAt is when the content of the file was last known right: its
// last scrub, or its verified download before the first. A scrub always
// follows the commit it checks (a commit has none), so a scrub dated
// before the download is still the later check, by a clock set back
// meanwhile; and a date in the future is only as good as the clock that
// wrote it (the scrub takes it as due now).
func (e Entry) CheckedAt() time.Time {
	if !e.ScrubbedAt.IsZero() {
		return e.ScrubbedAt
	}
	return e.VerifiedAt
}

// Store is a content-addressed image store. It is safe for concurrent use.
type Store struct {
	dir, images, tmp, partial string
	lock                      *os.File
	log                       *slog.Logger

	mu      sync.RWMutex
	entries map[osimage.SHA256]Entry
	// resuming holds the sha256s a Writer from Resume has open.
	resuming map[osimage.SHA256]bool
}

// Open prepares dir (creating dir/images and dir/tmp), removes what an
// interrupted download or deletion left in dir/tmp, and loads the committed
// entries of dir/images. A directory of dir/images without valid metadata,
// or whose image file is missing or of the wrong size, is removed: it cannot
// have been committed by a Store.
//
// Only one Store may have dir open at a time, in this process or another,
// since Open cleans dir/tmp: a second Open fails until the first is Closed
// (or its process exits).
//
// Every entry dropped, here or later by Store.Open, is logged with the
// reason, at warning level: an image that was verified once only goes
// away loudly.
func Open(dir string, opts ...Option) (*Store, error) {
	if dir == "" {
		return nil, errors.New("image store: no data directory given")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", dir, err)
	}
	s := &Store{
		dir:      abs,
		images:   filepath.Join(abs, imagesDir),
		tmp:      filepath.Join(abs, tmpDir),
		partial:  filepath.Join(abs, partialDir),
		entries:  map[osimage.SHA256]Entry{},
		resuming: map[osimage.SHA256]bool{},
		log:      slog.Default(),
	}
	for _, o := range opts {
		o(s)
	}
	if err := makeDataDir(s.dir); err != nil {
		return nil, err
	}
	for _, d := range []string{s.images, s.tmp, s.partial} {
		if err := makeOwnDir(d); err != nil {
			return nil, err
		}
	}
	if s.lock, err = s.openLock(); err != nil {
		return nil, fmt.Errorf("image store %s: %w", s.dir, err)
	}
	if err := s.cleanTmp(); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.scan(); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.cleanPartials(); err != nil {
		s.Close()
		return nil, err
	}
	s.reportSetAside()
	return s, nil
}

// Close releases the data directory for another Open. Files opened with
// Store.Open stay readable.
func (s *Store) Close() error {
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close()
	s.lock = nil
	return err
}

// makeDataDir makes the data directory dir, if missing. Its faults are
// told apart, each with its fix: a file where the directory (or one of
// its parents) should be is not a matter of permissions.
func makeDataDir(dir string) error {
	// The data directory itself may be a symlink (a mounted volume's
	// path): Stat follows it.
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("image store: %s is %s, not a directory: give the data directory, where the store keeps its images (it is made when missing)", dir, describe(dir, fi))
	}
	err := os.MkdirAll(dir, 0o755)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("image store: creating %s: %w: a parent of it is a file, not a directory; give a path under directories", dir, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return fmt.Errorf("image store: creating %s: %w: the data directory, or the directory it is made in, must be writable by this process", dir, err)
	}
	return fmt.Errorf("image store: creating %s: %w", dir, err)
}

// makeOwnDir makes the directory d of the data directory, if missing, and
// checks that it is one: not a symlink to a directory elsewhere, into which
// the store would write.
func makeOwnDir(d string) error {
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("image store: creating %s: %w (the data directory must be writable)", d, err)
	}
	fi, err := os.Lstat(d)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("image store: %s is %s, not a directory: the store keeps its files inside the data directory; move it away (a directory is made in its place)", d, describe(d, fi))
	}
	return nil
}

// openLock opens and locks the lock file.
func (s *Store) openLock() (*os.File, error) {
	path := filepath.Join(s.dir, lockFile)
	f, err := openChecked(path, os.O_RDWR|os.O_CREATE, 0o644, false)
	if isOddFile(err) {
		// The store only ever makes a regular file there: whatever else
		// has the name is no other store's lock.
		s.log.Warn("lock file replaced: it was not the file the store makes", "path", path, "reason", err.Error())
		if rerr := os.Remove(path); rerr != nil {
			return nil, fmt.Errorf("%w; removing it: %v (remove it by hand)", err, rerr)
		}
		f, err = openChecked(path, os.O_RDWR|os.O_CREATE, 0o644, false)
	}
	if err != nil {
		return nil, err
	}
	if err := lock(f, path); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Dir is the data directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) cleanTmp() error {
	des, err := os.ReadDir(s.tmp)
	if err != nil {
		return fmt.Errorf("image store: reading %s: %w", s.tmp, err)
	}
	for _, de := range des {
		if err := os.RemoveAll(filepath.Join(s.tmp, de.Name())); err != nil {
			return fmt.Errorf("image store: removing the leftover %s: %w", filepath.Join(s.tmp, de.Name()), err)
		}
	}
	return nil
}

// List returns the committed entries, ordered by sha256.
func (s *Store) List() []Entry {
	s.mu.RLock()
	out := make([]Entry, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, e)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.SHA256, b.SHA256) })
	return out
}

// Get returns the committed entry of sha256.
func (s *Store) Get(sha256 osimage.SHA256) (Entry, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.entries[sha256]
	return e, ok
}

// Open opens the verified image file of sha256, for http.ServeContent. The
// file stays readable after a Delete, until the caller closes it. An image
// file found replaced (a symlink, another kind of file, another size) is
// never opened: its entry is dropped and logged, and the error wraps
// ErrTampered.
func (s *Store) Open(sha256 osimage.SHA256) (*os.File, Entry, error) {
	e, ok := s.Get(sha256)
	if !ok {
		return nil, Entry{}, fmt.Errorf("image %s: %w", sha256, ErrNotFound)
	}
	dir := filepath.Join(s.images, string(sha256))
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		return nil, Entry{}, s.dropTampered(e, fmt.Sprintf("%s is not a directory (%s)", dir, fi.Mode().Type()))
	}
	path := filepath.Join(dir, e.Filename)
	f, err := openRegular(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, still := s.Get(sha256); !still {
				// Deleted between Get and open.
				return nil, Entry{}, fmt.Errorf("image %s: %w", sha256, ErrNotFound)
			}
			return nil, Entry{}, s.dropTampered(e, fmt.Sprintf("image file %s is gone", e.Filename))
		}
		var odd *oddFile
		if errors.As(err, &odd) {
			return nil, Entry{}, s.dropTampered(e, notRegular(e, odd.what))
		}
		return nil, Entry{}, fmt.Errorf("image %s: %w", sha256, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Entry{}, fmt.Errorf("image %s: %w", sha256, err)
	}
	if reason := notCommitted(path, fi, e); reason != "" {
		f.Close()
		return nil, Entry{}, s.dropTampered(e, reason)
	}
	return f, e, nil
}

// dropTampered removes the entry e, found changed since its commit, and
// logs it.
func (s *Store) dropTampered(e Entry, reason string) error {
	s.log.Warn("stored image dropped: it was tampered with after it was verified; it will be downloaded again if selected",
		"sha256", e.SHA256, "path", filepath.Join(s.images, string(e.SHA256)), "reason", reason)
	err := fmt.Errorf("image %s: %w: %s", e.SHA256, ErrTampered, reason)
	if derr := s.Delete(e.SHA256); derr != nil && !errors.Is(derr, ErrNotFound) {
		return fmt.Errorf("%w; removing it: %v", err, derr)
	}
	return err
}

// Delete removes the committed entry of sha256. Readers that have the file
// open keep reading it; its space is freed when the last one closes it. A
// crash during Delete leaves the entry either served or gone.
func (s *Store) Delete(sha256 osimage.SHA256) error {
	s.mu.Lock()
	if _, ok := s.entries[sha256]; !ok {
		s.mu.Unlock()
		return fmt.Errorf("deleting image %s: %w", sha256, ErrNotFound)
	}
	trash, err := os.MkdirTemp(s.tmp, "deleted-"+string(sha256)+"-")
	if err == nil {
		// Moving the directory out in one rename makes the removal atomic;
		// the slow part (unlinking a large file) happens outside images/.
		err = os.Rename(filepath.Join(s.images, string(sha256)), filepath.Join(trash, string(sha256)))
	}
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("deleting image %s: %w", sha256, err)
	}
	delete(s.entries, sha256)
	syncErr := syncDir(s.images)
	s.mu.Unlock()
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("deleting image %s: %w", sha256, err)
	}
	if syncErr != nil {
		return fmt.Errorf("deleting image %s: syncing %s: %w", sha256, s.images, syncErr)
	}
	return nil
}

// Used is the total size of the committed entries, in bytes. Image files
// are written sparse, so the disk may hold less than that.
func (s *Store) Used() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var n int64
	for _, e := range s.entries {
		n += e.Size
	}
	return n
}

// Available is the space left to unprivileged users on the file system of
// the data directory, in bytes.
func (s *Store) Available() (uint64, error) {
	n, err := available(s.dir)
	if err != nil {
		return 0, fmt.Errorf("image store: free space of %s: %w", s.dir, err)
	}
	return n, nil
}

// Create starts writing the image of sha256 into a staging directory. The
// caller must Commit or Abort the Writer.
func (s *Store) Create(sha256 osimage.SHA256) (*Writer, error) {
	if err := named(sha256); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(s.tmp, string(sha256)+"-")
	if err != nil {
		return nil, fmt.Errorf("image %s: creating a staging directory: %w", sha256, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, partialName), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("image %s: %w", sha256, err)
	}
	return &Writer{s: s, sha256: sha256, dir: dir, f: f, tail: &tailState{}}, nil
}

// commit moves a complete staging directory into images/.
func (s *Store) commit(staging string, e Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.entries[e.SHA256]; ok {
		// Same content committed by another download: nothing to do.
		os.RemoveAll(staging)
		return nil
	}
	final := filepath.Join(s.images, string(e.SHA256))
	if err := os.Rename(staging, final); err != nil {
		return fmt.Errorf("image %s: moving into %s: %w", e.SHA256, s.images, err)
	}
	// The rename is durable only once the directory holding it is synced.
	if err := syncDir(s.images); err != nil {
		os.RemoveAll(final)
		return fmt.Errorf("image %s: syncing %s: %w", e.SHA256, s.images, err)
	}
	s.entries[e.SHA256] = e
	return nil
}

func syncDir(dir string) error {
	// Not blocking, should something else than a directory have its name.
	d, err := openNoFollow(dir, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Option configures a Store.
type Option func(*Store)

// WithLogger logs what the store drops to log (default slog.Default()).
func WithLogger(log *slog.Logger) Option {
	return func(s *Store) {
		if log != nil {
			s.log = log
		}
	}
}

// named refuses the zero SHA256: every sha256 the store is given was
// parsed where it came in (osimage.ParseSHA256), but "" would name the
// store's own directories (images/, partial/).
func named(sha osimage.SHA256) error {
	if err := sha.Validate(); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	return nil
}
