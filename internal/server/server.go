package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/selection"
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
type PullFunc func(ctx context.Context, w selection.Wanted, dst *imagestore.Writer, progress func(received, total int64)) (md5 string, size int64, err error)

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

// Publisher writes the served set, and the filenames of its images,
// wherever consumers read them.
type Publisher interface {
	Publish(ctx context.Context, out osimage.ServedOutput) error
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
	// Concurrency bounds the downloads at once (0 means
	// DefaultConcurrency).
	Concurrency int
	// GCGrace is how long a deselected image stays on disk, so that a
	// selection flapping back does not download it again. 0 collects it at
	// the next pass (DefaultGCGrace is what serve uses).
	GCGrace time.Duration
	// FreeSpaceMargin is kept free on the data filesystem besides what a
	// download reserves; 0 keeps no margin (DefaultFreeSpaceMargin is what
	// serve uses).
	FreeSpaceMargin int64
	// AllowEmpty lets inputs that select no image replace a served set
	// that is not empty (Admit refuses them otherwise).
	AllowEmpty bool
	// MaxStorage, when set, bounds the bytes of stored images plus those
	// reserved by downloads in progress.
	MaxStorage int64
	// MaxImageSize bounds the file of an image that declares no size, and
	// refuses one that declares more (0 means DefaultMaxImageSize). The
	// bound is what a download reserves on disk, and what the store lets it
	// write: a decompression bomb stops there.
	MaxImageSize int64
	// StallTimeout cuts a download that receives no byte for that long,
	// from its start (manifest, signature) to its last network byte; it
	// fails and is retried with backoff (0 means DefaultStallTimeout).
	StallTimeout time.Duration
	// MinRate, in bytes per second: a download that received fewer than
	// MinRate × StallTimeout bytes over the last StallTimeout gives way to
	// an image waiting for a slot: it goes back to the queue behind the
	// images that have not given way, without counting as a failure. 0
	// never gives way.
	MinRate int64
	// SendTimeout is how long one write of a response may block: a client
	// that stops reading is cut after that long, one that reads at any
	// pace above 2 MiB per SendTimeout gets the whole image (0 means
	// DefaultSendTimeout).
	SendTimeout time.Duration
	// RetryBase and RetryMax shape the backoff of failed downloads
	// (default 10s doubling up to 10m).
	RetryBase, RetryMax time.Duration
	Logger              *slog.Logger
	Metrics             *Metrics
	// Now is the clock, for tests.
	Now func() time.Time
}

// Defaults of Config, and of serve's flags.
const (
	DefaultConcurrency     = 2
	DefaultGCGrace         = time.Hour
	DefaultFreeSpaceMargin = 1 << 30
	DefaultMaxImageSize    = 64 << 30
	DefaultStallTimeout    = 60 * time.Second
	DefaultMinRate         = 64 << 10
	DefaultSendTimeout     = 2 * time.Minute
)

// image is the server's record of one image, selected or kept on disk.
type image struct {
	selection.Wanted
	phase           Phase
	received, total int64
	// lastByte is when the download in progress last received a byte (or
	// started), on the monotonic clock.
	lastByte time.Time
	reason   string
	attempts int
	nextTry  time.Time
	// gaveWay is set when a download of the image was too slow and gave
	// way to the queue: it is tried again after the images that did not.
	gaveWay bool
	// waitingForSpace is set while the image waits for space reserved by
	// downloads in progress: it is not claimed until one of them ends.
	waitingForSpace  bool
	selected         bool
	deselectedAt     time.Time
	stored           bool
	entry            imagestore.Entry
	cancel           context.CancelFunc
	reservedForSpace int64
	// keptBy is what "image kept" was last logged for, so that it is
	// logged once per change, not at every collection.
	keptBy string
}

// Server selects, downloads, serves and publishes images.
type Server struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	images    map[string]*image
	ready     bool   // the first desired set is known
	waiting   string // before ready: why there is no catalog yet
	selectErr error
	kick      chan struct{}
	changed   chan struct{}
	published osimage.ServedOutput
	// inputs is what is known of the inputs (guard.go).
	inputs inputsGuard
}

// New builds a server over cfg.Store, whose verified images are known (and
// served again once selected) without downloading them.
//
// A zero Config field takes its default only where zero would mean nothing
// (Concurrency, MaxImageSize, StallTimeout, SendTimeout, the retry shape);
// GCGrace, FreeSpaceMargin and MinRate are used as given, 0 included.
// Negative values are the caller's to refuse (serve's flags are); here
// they count as 0.
func New(cfg Config) *Server {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	cfg.GCGrace = max(cfg.GCGrace, 0)
	cfg.FreeSpaceMargin = max(cfg.FreeSpaceMargin, 0)
	cfg.MaxStorage = max(cfg.MaxStorage, 0)
	cfg.MinRate = max(cfg.MinRate, 0)
	if cfg.MaxImageSize <= 0 {
		cfg.MaxImageSize = DefaultMaxImageSize
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = DefaultSendTimeout
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
			Wanted:       selection.Wanted{SHA256: e.SHA256, Image: osimage.Image{osimage.FieldFilename: e.Filename}},
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
func (s *Server) SetDesired(wanted map[string]selection.Wanted, selectErr error) {
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
		img.keptBy = ""
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
	// A download ended by the shutdown puts its image back in the queue:
	// ctx is checked before the next one is claimed, or the worker would
	// claim it again at once, for ever.
	for ctx.Err() == nil {
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

// next claims the image that needs a download now: the first in key order
// of those that never gave way, else the first of those that did.
func (s *Server) next() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	var best *image
	for _, img := range s.images {
		if !s.dueLocked(img, now) {
			continue
		}
		if best == nil || !img.gaveWay && best.gaveWay || img.gaveWay == best.gaveWay && img.Key < best.Key {
			best = img
		}
	}
	if best == nil {
		return "", false
	}
	best.phase = PhaseDownloading
	best.received, best.total = 0, best.Int64Field(osimage.FieldArchiveSize)
	best.lastByte = time.Now()
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
	dctx, cancel := context.WithCancelCause(ctx)
	img.cancel = func() { cancel(errDeselected) }
	s.mu.Unlock()
	defer cancel(nil)
	s.log.Info("download started", "sha256", sum, "key", w.Key, "uri", w.Image[osimage.FieldURI], "attempt", img.attempts)
	s.signal(s.changed)

	bound, need, err := s.bounds(w)
	if err == nil {
		bound, err = s.reserveSpace(sum, w, bound, need)
	}
	var entry imagestore.Entry
	if err == nil {
		stop := s.watch(dctx, sum, cancel)
		entry, err = s.pullInto(dctx, w, bound, stop)
		stop()
	}
	s.releaseSpace(sum)
	cause := context.Cause(dctx)

	s.mu.Lock()
	defer s.mu.Unlock()
	img.cancel = nil
	switch {
	case err == nil:
		img.phase = PhaseReady
		img.stored = true
		img.entry = entry
		img.attempts = 0
		img.gaveWay = false
		s.log.Info("image ready", "sha256", sum, "key", w.Key, "bytes", entry.Size)
	case !img.selected:
		s.log.Info("download cancelled: image deselected", "sha256", sum, "key", w.Key)
		delete(s.images, sum)
	case ctx.Err() != nil:
		// Shutdown: not a failed attempt. The worker stops after this.
		img.phase = PhaseQueued
		img.attempts--
		img.received = 0
		s.log.Info("download interrupted by shutdown; its partial file is removed", "sha256", sum, "key", w.Key)
	case errors.As(err, new(*spaceWait)):
		img.phase = PhaseQueued
		img.attempts--
		img.reason = err.Error()
		s.log.Info("download waits for space", "sha256", sum, "key", w.Key, "reason", err.Error())
	case errors.As(cause, new(*gaveWayError)):
		img.phase = PhaseQueued
		img.attempts--
		img.gaveWay = true
		img.received = 0
		img.reason = cause.Error()
		s.log.Warn("download gave way to the queue", "sha256", sum, "key", w.Key, "reason", cause.Error())
	default:
		if errors.As(cause, new(*stallError)) {
			err = fmt.Errorf("%w; the attempt ended with: %v", cause, err)
		}
		img.phase = PhaseFailed
		img.reason = err.Error()
		img.nextTry = s.cfg.Now().Add(s.backoff(img.attempts))
		if s.cfg.Metrics != nil && isVerifyError(err) {
			s.cfg.Metrics.verifyFailures.Inc()
		}
		s.log.Error("download failed", "sha256", sum, "key", w.Key, "attempt", img.attempts, "retryAt", img.nextTry.Format(time.RFC3339), "error", err)
	}
	s.signal(s.changed)
	if ctx.Err() == nil {
		s.signal(s.kick)
	}
}

// pullInto downloads w into a new temporary file of the store, bounded to
// bound bytes, and commits it once verified; anything short of that leaves
// nothing behind. pulled is called once the network part is over.
func (s *Server) pullInto(ctx context.Context, w selection.Wanted, bound int64, pulled func()) (imagestore.Entry, error) {
	dst, err := s.cfg.Store.Create(w.SHA256)
	if err != nil {
		return imagestore.Entry{}, err
	}
	dst.SetLimit(bound)
	var last int64
	progress := func(received, total int64) {
		s.mu.Lock()
		img := s.images[w.SHA256]
		if received > img.received {
			img.lastByte = time.Now()
		}
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
	pulled()
	if errors.Is(err, imagestore.ErrLimit) && !declaresSize(w) {
		err = fmt.Errorf("%w; the image declares no size, so it is bounded by --max-image-size or, when less, by the space that was free (%s): declare its size, grow the data volume, or raise --max-image-size if it really is larger", err, bytesIEC(bound))
	}
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

// bounds reads w's sizes and returns the most bytes its file may have (its
// declared size, or MaxImageSize when it declares none) and what its
// download reserves on disk (that bound plus archive-size). Malformed sizes
// and a size above MaxImageSize are refused.
func (s *Server) bounds(w selection.Wanted) (bound, need int64, err error) {
	size, err := w.Image.Size(osimage.FieldSize)
	if err != nil {
		return 0, 0, fmt.Errorf("os_images.%s.%w", w.Key, err)
	}
	archive, err := w.Image.Size(osimage.FieldArchiveSize)
	if err != nil {
		return 0, 0, fmt.Errorf("os_images.%s.%w", w.Key, err)
	}
	if size > s.cfg.MaxImageSize {
		return 0, 0, fmt.Errorf("os_images.%s.size is %s (%d bytes), more than --max-image-size %s; raise --max-image-size if the image really is that large",
			w.Key, bytesIEC(size), size, bytesIEC(s.cfg.MaxImageSize))
	}
	bound = size
	if bound == 0 {
		bound = s.cfg.MaxImageSize
	}
	return bound, addSizes(bound, archive), nil
}

// declaresSize says whether w gives the size of its file (0 means unknown).
func declaresSize(w selection.Wanted) bool {
	n, err := w.Image.Size(osimage.FieldSize)
	return err == nil && n > 0
}

// addSizes adds sizes without wrapping around.
func addSizes(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// reserveSpace reserves need bytes for the download of sum, or says why it
// cannot. need covers the bound the store enforces on the file (see
// bounds), so that a download never takes the space of another;
// archive-size counts too, as a cautious margin. When the disk (or
// --max-storage) cannot hold the image at all, the error fails it; when it
// could but for what downloads in progress reserved, the error is a
// *spaceWait and the image waits, without failing, until one of them ends.
//
// An image that declares no size is bounded by --max-image-size, which is
// more than most data volumes hold: when nothing else is reserved, its
// bound shrinks to the space there is, so that it is tried (and fails only
// if it really is larger) instead of being refused outright. It returns the
// bound reserved.
func (s *Server) reserveSpace(sum string, w selection.Wanted, bound, need int64) (int64, error) {
	why := "archive-size + size"
	if !declaresSize(w) {
		why = fmt.Sprintf("archive-size + --max-image-size %s, as the image declares no size", bytesIEC(bound))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var reserved int64
	for _, img := range s.images {
		reserved = addSizes(reserved, img.reservedForSpace)
	}
	wait := func(msg string) (int64, error) {
		// Set under the lock that releaseSpace takes, so that a release
		// cannot slip between this check and the wait.
		s.images[sum].waitingForSpace = true
		return 0, &spaceWait{msg: msg}
	}
	avail, err := s.cfg.Store.Available()
	if err != nil {
		return 0, fmt.Errorf("checking free disk space: %w", err)
	}
	free := int64(min(avail, math.MaxInt64))
	if !declaresSize(w) {
		archive := need - bound
		room := free - s.cfg.FreeSpaceMargin
		if s.cfg.MaxStorage > 0 {
			room = min(room, s.cfg.MaxStorage-s.cfg.Store.Used())
		}
		if room -= archive; room < bound {
			if reserved > 0 {
				return wait(fmt.Sprintf("waiting for disk space: the image declares no size, so it may take all the space that is free (up to --max-image-size %s) once the downloads in progress, which reserved %s, end",
					bytesIEC(bound), bytesIEC(reserved)))
			}
			if room > 0 {
				bound, need = room, room+archive
				why = fmt.Sprintf("archive-size + the %s free, as the image declares no size", bytesIEC(bound))
			}
		}
	}
	if s.cfg.MaxStorage > 0 {
		used := s.cfg.Store.Used()
		if addSizes(used, need) > s.cfg.MaxStorage {
			return 0, fmt.Errorf("not enough storage: the image needs %s (%s), %s are used, and --max-storage is %s; raise --max-storage or deselect images",
				bytesIEC(need), why, bytesIEC(used), bytesIEC(s.cfg.MaxStorage))
		}
		if addSizes(addSizes(used, reserved), need) > s.cfg.MaxStorage {
			return wait(fmt.Sprintf("waiting for storage: the image needs %s (%s), %s are used and %s reserved by downloads in progress, and --max-storage is %s",
				bytesIEC(need), why, bytesIEC(used), bytesIEC(reserved), bytesIEC(s.cfg.MaxStorage)))
		}
	}
	if free < addSizes(need, s.cfg.FreeSpaceMargin) {
		return 0, fmt.Errorf("not enough free disk space: the image needs %s (%s) plus a margin of %s, and %s are free; grow the data volume or deselect images",
			bytesIEC(need), why, bytesIEC(s.cfg.FreeSpaceMargin), bytesIEC(free))
	}
	if free < addSizes(addSizes(need, reserved), s.cfg.FreeSpaceMargin) {
		return wait(fmt.Sprintf("waiting for disk space: the image needs %s (%s) plus a margin of %s, %s are free and downloads in progress reserved %s",
			bytesIEC(need), why, bytesIEC(s.cfg.FreeSpaceMargin), bytesIEC(free), bytesIEC(reserved)))
	}
	s.images[sum].reservedForSpace = need
	return bound, nil
}

// spaceWait says that an image waits for the space that downloads in
// progress reserved.
type spaceWait struct{ msg string }

func (e *spaceWait) Error() string { return e.msg }

// releaseSpace gives back what the download of sum reserved; the images
// waiting for space try again.
func (s *Server) releaseSpace(sum string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok || img.reservedForSpace == 0 {
		return
	}
	img.reservedForSpace = 0
	for _, other := range s.images {
		other.waitingForSpace = false
	}
	s.signal(s.kick)
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

// outputLocked is what is published: the served set and the filenames of
// its images.
func (s *Server) outputLocked() osimage.ServedOutput {
	out := osimage.ServedOutput{Set: s.servedLocked(), Filenames: osimage.ServedFilenames{}}
	for sum := range out.Set {
		out.Filenames[sum] = s.images[sum].ServedAs()
	}
	return out
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
		served := s.outputLocked()
		same := s.published.Set != nil && served.Equal(s.published)
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
		s.log.Info("served set published", "images", len(served.Set), "available", countAvailable(served.Set))
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
	if !s.ready {
		// Until a desired set is known, every stored image looks
		// deselected: a catalog that is late must not cost the images.
		s.mu.Unlock()
		return
	}
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
			by := strings.Join(refs.ReferencedBy(sum), ", ")
			s.mu.Lock()
			img, ok := s.images[sum]
			changed := ok && img.keptBy != by
			if changed {
				img.keptBy = by
			}
			s.mu.Unlock()
			if changed && by != "" {
				s.log.Info("image kept: still referenced by "+by, "sha256", sum)
			}
			return by != ""
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
	// Filenames are all the filenames the image is served under.
	Filenames []string
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
			SHA256: sum, Key: img.Key, Filename: img.Filename(), Filenames: img.ServedAs(), URI: img.Image.Get(osimage.FieldURI),
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
	filenames      []string
	md5            string
	verifiedAt     time.Time
}

func (s *Server) lookup(sum string) (lookup, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok {
		return lookup{}, false
	}
	served := img.selected || len(s.keptByLocked(sum, img)) > 0
	return lookup{served: served, stored: img.stored, phase: img.phase, filenames: img.ServedAs(), md5: img.entry.MD5, verifiedAt: img.entry.VerifiedAt}, true
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

// forgetStored notes that the stored file of sum is gone (the store found
// it tampered with and dropped it): a selected image is queued again.
func (s *Server) forgetStored(sum string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok || !img.stored {
		return
	}
	img.stored = false
	img.entry = imagestore.Entry{}
	if !img.selected {
		delete(s.images, sum)
		return
	}
	img.phase = PhaseQueued
	img.reason = "the stored file was tampered with and dropped; downloading it again"
	s.signal(s.kick)
	s.signal(s.changed)
}
