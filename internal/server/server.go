package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/signature"
)

// Phase is where an image stands.
type Phase string

// The phases of an image, in the order a successful one goes through.
const (
	PhaseQueued      Phase = "queued"
	PhaseDownloading Phase = "downloading"
	PhaseVerifying   Phase = "verifying"
	PhaseReady       Phase = "ready"
	PhaseFailed      Phase = "failed"
)

// Store is the content-addressed storage the server fills and serves from.
type Store interface {
	List() []imagestore.Entry
	Open(sha256 string) (*os.File, imagestore.Entry, error)
	Create(sha256 string) (*imagestore.Writer, error)
	Delete(sha256 string) error
	Available() (uint64, error)
	Used() int64
}

// PullFunc downloads and verifies one image into dst, in one pass, and
// reports the verified md5 and size of the file written. progress gets the
// network bytes received and the total expected (0 when unknown).
type PullFunc func(ctx context.Context, w Wanted, dst *imagestore.Writer, progress func(received, total int64)) (md5 string, size int64, err error)

// References tells which objects still reference an image. A deselected
// image that is referenced is kept on disk and served, however long ago it
// was deselected: Metal3 boots new and re-provisioned hosts from the
// templates that name it.
type References interface {
	// Synced is false until every reference is known; nothing is
	// collected before.
	Synced() bool
	// ReferencedBy names the objects that reference sha256, as KIND NS/NAME.
	ReferencedBy(sha256 string) []string
}

// Publisher writes the served set wherever consumers read it.
type Publisher interface {
	Publish(ctx context.Context, served osimage.ServedSet) error
}

// Config is what a Server needs.
type Config struct {
	Store Store
	Pull  PullFunc
	// Publisher, when set, gets the served set whenever it changes.
	Publisher Publisher
	// References, when set, keeps deselected images that are still
	// referenced (reference-safe garbage collection).
	References References
	// Concurrency bounds the downloads at once (default 2).
	Concurrency int
	// GCGrace is how long a deselected image stays on disk (default 1h),
	// so that a selection flapping back does not download it again.
	GCGrace time.Duration
	// FreeSpaceMargin is kept free on the data filesystem besides what a
	// download needs (default 1 GiB).
	FreeSpaceMargin int64
	// MaxStorage, when set, bounds the bytes of stored images plus those of
	// downloads in progress.
	MaxStorage int64
	// RetryBase and RetryMax shape the backoff of failed downloads
	// (default 10s doubling up to 10m).
	RetryBase, RetryMax time.Duration
	Logger              *slog.Logger
	Metrics             *Metrics
	// Now is the clock, for tests.
	Now func() time.Time
}

// image is the server's record of one image, selected or kept on disk.
type image struct {
	Wanted
	phase            Phase
	received, total  int64
	reason           string
	attempts         int
	nextTry          time.Time
	selected         bool
	deselectedAt     time.Time
	stored           bool
	entry            imagestore.Entry
	cancel           context.CancelFunc
	reservedForSpace int64
}

// Server selects, downloads, serves and publishes images.
type Server struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	images    map[string]*image
	ready     bool // the first desired set is known
	selectErr error
	kick      chan struct{}
	changed   chan struct{}
	published osimage.ServedSet
}

// New builds a server over cfg.Store, whose verified images are known (and
// served again once selected) without downloading them.
func New(cfg Config) *Server {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2
	}
	if cfg.GCGrace <= 0 {
		cfg.GCGrace = time.Hour
	}
	if cfg.FreeSpaceMargin <= 0 {
		cfg.FreeSpaceMargin = 1 << 30
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 10 * time.Second
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 10 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		images:  map[string]*image{},
		kick:    make(chan struct{}, 1),
		changed: make(chan struct{}, 1),
	}
	now := cfg.Now()
	for _, e := range cfg.Store.List() {
		// Stored but not (yet) selected: kept for the grace period, so that
		// a restart never deletes what the next desired set still needs.
		s.images[e.SHA256] = &image{
			Wanted:       Wanted{SHA256: e.SHA256, Image: osimage.Image{osimage.FieldFilename: e.Filename}},
			phase:        PhaseReady,
			stored:       true,
			entry:        e,
			deselectedAt: now,
		}
	}
	if cfg.Metrics != nil {
		cfg.Metrics.bind(s)
	}
	return s
}

// SetDesired replaces the set of images to serve. Newly selected images
// are queued, already stored ones are served at once, and deselected ones
// stop being served (a download of theirs is cancelled; their file is
// collected after the grace period). selectErr is what selection could not
// do, shown on the status page.
func (s *Server) SetDesired(wanted map[string]Wanted, selectErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	s.ready = true
	s.selectErr = selectErr
	for sum, w := range wanted {
		img, ok := s.images[sum]
		if !ok {
			img = &image{phase: PhaseQueued}
			s.images[sum] = img
			s.log.Info("image selected", "sha256", sum, "key", w.Key, "uri", w.Image[osimage.FieldURI], "selectedBy", w.SelectedBy)
		}
		img.Wanted = w
		img.selected = true
		img.deselectedAt = time.Time{}
		if img.phase == PhaseFailed {
			// New inputs may well fix what failed: try again now.
			img.nextTry = time.Time{}
			img.attempts = 0
		}
	}
	for sum, img := range s.images {
		if _, ok := wanted[sum]; ok || !img.selected {
			continue
		}
		img.selected = false
		img.deselectedAt = now
		s.log.Info("image deselected", "sha256", sum, "key", img.Key, "phase", img.phase)
		if img.cancel != nil {
			img.cancel()
		}
		if !img.stored && img.phase != PhaseDownloading && img.phase != PhaseVerifying {
			delete(s.images, sum)
		}
	}
	s.signal(s.kick)
	s.signal(s.changed)
}

func (s *Server) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Run downloads, collects garbage and publishes until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range s.cfg.Concurrency {
		wg.Go(func() { s.worker(ctx) })
	}
	wg.Go(func() { s.publishLoop(ctx) })
	wg.Go(func() { s.gcLoop(ctx) })
	wg.Wait()
	return nil
}

func (s *Server) worker(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if sum, ok := s.next(); ok {
			s.download(ctx, sum)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-tick.C:
		}
	}
}

// next claims the first image, in key order, that needs a download now.
func (s *Server) next() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	var best *image
	for _, img := range s.images {
		if !img.selected || img.stored {
			continue
		}
		due := img.phase == PhaseQueued || img.phase == PhaseFailed && !now.Before(img.nextTry)
		if due && (best == nil || img.Key < best.Key) {
			best = img
		}
	}
	if best == nil {
		return "", false
	}
	best.phase = PhaseDownloading
	best.received, best.total = 0, best.Int64Field(osimage.FieldArchiveSize)
	best.reason = ""
	best.attempts++
	// Another worker may be kicked for the rest of the queue.
	s.signal(s.kick)
	return best.SHA256, true
}

func (s *Server) download(ctx context.Context, sum string) {
	s.mu.Lock()
	img := s.images[sum]
	w := img.Wanted
	dctx, cancel := context.WithCancel(ctx)
	img.cancel = cancel
	s.mu.Unlock()
	defer cancel()
	s.log.Info("download started", "sha256", sum, "key", w.Key, "uri", w.Image[osimage.FieldURI], "attempt", img.attempts)
	s.signal(s.changed)

	err := s.reserveSpace(sum, w)
	var entry imagestore.Entry
	if err == nil {
		entry, err = s.pullInto(dctx, w)
	}
	defer s.releaseSpace(sum)

	s.mu.Lock()
	defer s.mu.Unlock()
	img.cancel = nil
	switch {
	case err == nil:
		img.phase = PhaseReady
		img.stored = true
		img.entry = entry
		img.attempts = 0
		s.log.Info("image ready", "sha256", sum, "key", w.Key, "bytes", entry.Size)
	case !img.selected:
		s.log.Info("download cancelled: image deselected", "sha256", sum, "key", w.Key)
		delete(s.images, sum)
	case ctx.Err() != nil:
		img.phase = PhaseQueued
	default:
		img.phase = PhaseFailed
		img.reason = err.Error()
		img.nextTry = s.cfg.Now().Add(s.backoff(img.attempts))
		if s.cfg.Metrics != nil && isVerifyError(err) {
			s.cfg.Metrics.verifyFailures.Inc()
		}
		s.log.Error("download failed", "sha256", sum, "key", w.Key, "attempt", img.attempts, "retryAt", img.nextTry.Format(time.RFC3339), "error", err)
	}
	s.signal(s.changed)
	s.signal(s.kick)
}

// pullInto downloads w into a new temporary file of the store and commits
// it once verified; anything short of that leaves nothing behind.
func (s *Server) pullInto(ctx context.Context, w Wanted) (imagestore.Entry, error) {
	dst, err := s.cfg.Store.Create(w.SHA256)
	if err != nil {
		return imagestore.Entry{}, err
	}
	var last int64
	progress := func(received, total int64) {
		s.mu.Lock()
		img := s.images[w.SHA256]
		img.received = received
		if total > 0 {
			img.total = total
		}
		if img.total > 0 && received >= img.total {
			img.phase = PhaseVerifying
		}
		s.mu.Unlock()
		if s.cfg.Metrics != nil && received > last {
			s.cfg.Metrics.bytesDownloaded.Add(float64(received - last))
		}
		last = received
	}
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.inFlight.Inc()
		defer s.cfg.Metrics.inFlight.Dec()
	}
	md5, size, err := s.cfg.Pull(ctx, w, dst, progress)
	entry := imagestore.Entry{SHA256: w.SHA256, MD5: md5, Filename: w.Filename(), Size: size, VerifiedAt: s.cfg.Now()}
	if err == nil {
		s.mu.Lock()
		s.images[w.SHA256].phase = PhaseVerifying
		s.mu.Unlock()
		err = dst.Commit(entry)
	}
	if err != nil {
		_ = dst.Abort()
		return imagestore.Entry{}, err
	}
	return entry, nil
}

// reserveSpace refuses a download that the disk (or --max-storage) cannot
// hold, counting what the other downloads in progress have reserved: the
// archive may be kept while the image is written, so both count.
func (s *Server) reserveSpace(sum string, w Wanted) error {
	need := w.Int64Field(osimage.FieldArchiveSize) + w.Int64Field(osimage.FieldSize)
	s.mu.Lock()
	defer s.mu.Unlock()
	var reserved int64
	for _, img := range s.images {
		reserved += img.reservedForSpace
	}
	if s.cfg.MaxStorage > 0 {
		used := s.cfg.Store.Used()
		if used+reserved+need > s.cfg.MaxStorage {
			return fmt.Errorf("not enough storage: the image needs %s (archive-size + size), %s are used and %s reserved by other downloads, and --max-storage is %s; raise --max-storage or deselect images",
				bytesIEC(need), bytesIEC(used), bytesIEC(reserved), bytesIEC(s.cfg.MaxStorage))
		}
	}
	free, err := s.cfg.Store.Available()
	if err != nil {
		return fmt.Errorf("checking free disk space: %w", err)
	}
	if int64(free) < need+reserved+s.cfg.FreeSpaceMargin {
		return fmt.Errorf("not enough free disk space: the image needs %s (archive-size + size) plus a margin of %s, other downloads reserved %s, and %s are free; grow the data volume or deselect images",
			bytesIEC(need), bytesIEC(s.cfg.FreeSpaceMargin), bytesIEC(reserved), bytesIEC(int64(free)))
	}
	s.images[sum].reservedForSpace = need
	return nil
}

func (s *Server) releaseSpace(sum string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if img, ok := s.images[sum]; ok {
		img.reservedForSpace = 0
	}
}

func (s *Server) backoff(attempts int) time.Duration {
	d := s.cfg.RetryBase
	for i := 1; i < attempts && d < s.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, s.cfg.RetryMax)
}

// Served is the served set as published: every selected image, available
// only once verified and stored.
func (s *Server) Served() osimage.ServedSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.servedLocked()
}

func (s *Server) servedLocked() osimage.ServedSet {
	out := osimage.ServedSet{}
	for sum, img := range s.images {
		if img.selected {
			out[sum] = osimage.ServedImage{Available: img.phase == PhaseReady && img.stored, ImageKey: img.Key}
		}
	}
	return out
}

func (s *Server) publishLoop(ctx context.Context) {
	if s.cfg.Publisher == nil {
		return
	}
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.changed:
		case <-retry.C:
		}
		s.mu.Lock()
		ready := s.ready
		served := s.servedLocked()
		same := s.published != nil && maps.Equal(served, s.published)
		s.mu.Unlock()
		if !ready || same {
			continue
		}
		if err := s.cfg.Publisher.Publish(ctx, served); err != nil {
			s.log.Error("publishing the served set failed; retrying", "error", err)
			retry.Reset(5 * time.Second)
			continue
		}
		s.mu.Lock()
		s.published = served
		s.mu.Unlock()
		s.log.Info("served set published", "images", len(served), "available", countAvailable(served))
	}
}

func countAvailable(s osimage.ServedSet) int {
	n := 0
	for _, e := range s {
		if e.Available {
			n++
		}
	}
	return n
}

func (s *Server) gcLoop(ctx context.Context) {
	interval := min(s.cfg.GCGrace/4, time.Minute)
	tick := time.NewTicker(max(interval, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.CollectGarbage()
		}
	}
}

// CollectGarbage deletes the stored images deselected for longer than the
// grace period. A client still downloading one keeps its open file.
func (s *Server) CollectGarbage() {
	s.mu.Lock()
	now := s.cfg.Now()
	var victims []string
	for sum, img := range s.images {
		if !img.selected && img.stored && now.Sub(img.deselectedAt) >= s.cfg.GCGrace {
			victims = append(victims, sum)
		}
	}
	s.mu.Unlock()
	if refs := s.cfg.References; refs != nil && len(victims) > 0 {
		if !refs.Synced() {
			s.log.Warn("garbage collection postponed: the Metal3 objects that may reference images are not all known yet", "candidates", len(victims))
			return
		}
		victims = slices.DeleteFunc(victims, func(sum string) bool {
			by := refs.ReferencedBy(sum)
			if len(by) > 0 {
				s.log.Info("image kept: still referenced by "+strings.Join(by, ", "), "sha256", sum)
			}
			return len(by) > 0
		})
	}
	for _, sum := range victims {
		if err := s.cfg.Store.Delete(sum); err != nil {
			s.log.Error("garbage collection failed", "sha256", sum, "error", err)
			continue
		}
		s.mu.Lock()
		if img, ok := s.images[sum]; ok && !img.selected {
			delete(s.images, sum)
		}
		s.mu.Unlock()
		s.log.Info("image deleted after the grace period", "sha256", sum)
	}
}

// Status is one image as the status page and the metrics show it.
type Status struct {
	SHA256, Key, Filename, URI string
	Phase                      Phase
	Selected                   bool
	Received, Total, Size      int64
	Reason                     string
	NextTry                    time.Time
	DeselectedAt               time.Time
	// KeptBy names the objects that still reference a deselected image,
	// which is therefore kept and served.
	KeptBy []string
}

// Statuses returns every known image, selected ones first, by key.
func (s *Server) Statuses() ([]Status, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.images))
	for _, sum := range slices.Sorted(maps.Keys(s.images)) {
		img := s.images[sum]
		size := img.Int64Field(osimage.FieldSize)
		if img.stored {
			size = img.entry.Size
		}
		out = append(out, Status{
			SHA256: sum, Key: img.Key, Filename: img.Filename(), URI: img.Image.Get(osimage.FieldURI),
			Phase: img.phase, Selected: img.selected, Received: img.received, Total: img.total, Size: size,
			Reason: img.reason, NextTry: img.nextTry, DeselectedAt: img.deselectedAt,
			KeptBy: s.keptByLocked(sum, img),
		})
	}
	slices.SortStableFunc(out, func(a, b Status) int {
		switch {
		case a.Selected != b.Selected && a.Selected:
			return -1
		case a.Selected != b.Selected:
			return 1
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
	return out, s.selectErr
}

// Ready says whether the server knows what to serve.
func (s *Server) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}

// keptByLocked names what keeps a deselected, stored image.
func (s *Server) keptByLocked(sum string, img *image) []string {
	if img.selected || !img.stored || s.cfg.References == nil {
		return nil
	}
	return s.cfg.References.ReferencedBy(sum)
}

// lookup is what the HTTP handler needs to answer for one sha256.
type lookup struct {
	// served: selected, or deselected but kept because referenced.
	served, stored bool
	phase          Phase
	filename, md5  string
}

func (s *Server) lookup(sum string) (lookup, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok {
		return lookup{}, false
	}
	served := img.selected || len(s.keptByLocked(sum, img)) > 0
	return lookup{served: served, stored: img.stored, phase: img.phase, filename: img.Filename(), md5: img.entry.MD5}, true
}

// isVerifyError tells a refusal of the content (digests, sizes, the pinned
// manifest, the signature) from a failure to fetch it.
func isVerifyError(err error) bool {
	var v *pull.VerifyError
	var refused *signature.Error
	return errors.As(err, &v) || errors.As(err, &refused)
}

func bytesIEC(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
