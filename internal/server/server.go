package server

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/selection"
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
	// Resume opens the partial download of sha256, kept from an earlier
	// attempt or process, or starts one.
	Resume(sha256 string) (*imagestore.Writer, error)
	// Partials lists the partial downloads kept; RemovePartial removes one.
	Partials() ([]imagestore.Partial, error)
	RemovePartial(sha256 string) error
	Delete(sha256 string) error
	Available() (uint64, error)
	Used() int64
	// Scrub re-hashes a stored image (scrub.go); a mismatch drops it and
	// wraps imagestore.ErrTampered.
	Scrub(ctx context.Context, sha256 string, throttle func(ctx context.Context, n int) error, now func() time.Time) (imagestore.Entry, error)
}

// PullFunc downloads and verifies one image into dst, in one pass, and
// reports the verified md5 and size of the file written, and what was kept
// from an earlier pull into dst (a Writer from Store.Resume). progress gets
// the network bytes received and the total expected (0 when unknown).
type PullFunc func(ctx context.Context, w selection.Wanted, dst *imagestore.Writer, progress func(received, total int64)) (pull.Result, error)

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

// OutputWatcher is a Publisher whose output others can change: a ConfigMap
// deleted or edited by hand. WatchOutput tells observed what the output
// holds (exists false: it is gone) whenever that changes, until ctx ends;
// the server publishes again what it published last when the output no
// longer holds it.
type OutputWatcher interface {
	WatchOutput(ctx context.Context, observed func(data map[string]string, exists bool)) error
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
	// Replicas, when set, are the other servers of the Service: images
	// are filled from them first, one replica per image pulls from the
	// registry, and only the leader (SetLeader) publishes (replicas.go).
	Replicas Replicas
	// PeerTimeout is how long a peer may show no progress before another
	// source takes over (0 means DefaultPeerTimeout).
	PeerTimeout time.Duration
	// ReportPeer, when set, also reports a peer that failed.
	ReportPeer PeerReporter

	// ScrubInterval is how often each stored image is re-hashed, counted
	// from when it was last verified or scrubbed (0: never; scrub.go).
	ScrubInterval time.Duration
	// ScrubRate bounds the bytes per second the scrub reads (0 means
	// DefaultScrubRate).
	ScrubRate int64

	// Now is the clock, for tests.
	Now func() time.Time
}

// Defaults of Config, and of serve's flags.
const (
	DefaultConcurrency     = 2
	DefaultGCGrace         = time.Hour
	DefaultFreeSpaceMargin = 1 << 30
	DefaultMaxImageSize    = selection.DefaultMaxImageSize
	DefaultStallTimeout    = 60 * time.Second
	DefaultMinRate         = 64 << 10
	DefaultSendTimeout     = 2 * time.Minute
	DefaultScrubInterval   = 7 * 24 * time.Hour
	DefaultScrubRate       = 50 << 20
)

// image is the server's record of one image, selected or kept on disk.
type image struct {
	selection.Wanted
	phase           Phase
	received, total int64
	// lastByte is when the download in progress last received a byte (or
	// started, or showed it was alive while checking the bytes kept by an
	// earlier attempt), on the monotonic clock.
	lastByte time.Time
	// checkingKept: the download reads back and checks the bytes kept by
	// an earlier attempt; no network byte comes, and it is not slow.
	checkingKept bool
	reason       string
	attempts     int
	nextTry      time.Time
	// gaveWay is set when a download of the image was too slow and gave
	// way to the queue: it is tried again after the images that did not.
	gaveWay bool
	// waitingForSpace is set while the image waits for space reserved by
	// downloads in progress: it is not claimed until one of them ends.
	waitingForSpace bool
	selected        bool
	deselectedAt    time.Time
	stored          bool
	entry           imagestore.Entry
	cancel          context.CancelFunc
	// yield ends the download in progress with a cause that puts it back
	// in the queue (a *yieldError), without counting as a failure.
	yield            func(error)
	reservedForSpace int64
	// recordFailed are the records of a fleet need that failed in this
	// round of attempts, by recordID, with their error (fleetneeds.go).
	recordFailed map[string]string
	// keptBy is what "image kept" was last logged for, so that it is
	// logged once per change, not at every collection.
	keptBy string
	// source is where the copy comes from (replicas.go); writer is the
	// download in progress, which peers may stream; badPeers are the
	// peers that failed to fill it, skipped until it is stored.
	source   string
	writer   *imagestore.Writer
	badPeers map[string]time.Time
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
	// publishing is what was last given to the Publisher, and republish
	// says that the output no longer holds it (publish.go).
	publishing osimage.ServedOutput
	republish  bool
	// gcLastPass is when the last complete collection began (gc.go).
	gcLastPass time.Time
	// inputs is what is known of the inputs (guard.go).
	inputs inputsGuard

	// With Replicas (replicas.go): what was last read of each ready peer,
	// whether a first round was read, whether this replica leads, whether
	// it was found ready once; when each ready peer was first seen ready,
	// and which images were available at the last count (leader or not).
	peerViews     map[string]peerView
	readySeen     map[string]time.Time
	lastAvailable map[string]bool
	peersKnown    bool
	// listedIDs are the replicas listed at the last read, changed at
	// listedChangedAt.
	listedIDs       []string
	listedChangedAt time.Time
	leader          bool
	readyOnce       bool
	peerPuller      *pull.Puller
	// scrub is the state of the scrub (scrub.go).
	scrub scrubState
	// refusedNeeds are the fleet's needs refused by policy (fleetneeds.go).
	refusedNeeds osimage.RefusedNeeds
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
	if cfg.ScrubRate <= 0 {
		cfg.ScrubRate = DefaultScrubRate
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = DefaultPeerTimeout
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		images:  map[string]*image{},
		kick:    make(chan struct{}, 1),
		changed: make(chan struct{}, 1),
		peerPuller: &pull.Puller{
			HTTP: &http.Client{Transport: peerTransport()}, IdleTimeout: cfg.PeerTimeout,
			MaxRetries: 2, Backoff: 200 * time.Millisecond, MaxBackoff: time.Second,
		},
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
			source:       SourceStore,
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
	if w, ok := s.cfg.Publisher.(OutputWatcher); ok {
		wg.Go(func() {
			if err := w.WatchOutput(ctx, s.outputObserved); err != nil && ctx.Err() == nil {
				s.log.Error("the published output cannot be watched: deleted or edited by hand, it is published again only at the next change", "error", err)
			}
		})
	}
	wg.Go(func() { s.gcLoop(ctx) })
	if s.cfg.Replicas != nil {
		wg.Go(func() { s.pollPeers(ctx, nil) })
	}
	wg.Go(func() { s.scrubLoop(ctx) })
	wg.Wait()
	return nil
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
	// ReferencesUnknown: the image is deselected, and kept and served
	// until the Metal3 objects that may reference it are all known.
	ReferencesUnknown bool
	// Filenames are all the filenames the image is served under.
	Filenames []string
	// CheckedAt is when the stored file was last verified or scrubbed.
	CheckedAt time.Time
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
			KeptBy: s.keptByLocked(sum, img), ReferencesUnknown: s.referencesUnknownLocked(img),
			CheckedAt: img.entry.CheckedAt(),
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

// lookup is what the HTTP handler needs to answer for one sha256.
type lookup struct {
	// served: selected, or deselected but kept because referenced (or
	// because the references are not all known yet).
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
	served := img.selected || s.referencesUnknownLocked(img) || len(s.keptByLocked(sum, img)) > 0
	return lookup{served: served, stored: img.stored, phase: img.phase, filenames: img.ServedAs(), md5: img.entry.MD5, verifiedAt: img.entry.VerifiedAt}, true
}
