// Package server is the image server's state: the table of the images it
// serves, each with its lifecycle (lifecycle.go); the download queue, the
// disk space it reserves, the collection of what is no longer selected and
// the scrub of what is stored (package scrub drives it); what it publishes.
// Where the bytes come from is package fill's; how replicas share them,
// package replica's; its HTTP face (the image URLs, the status page, the
// metrics), package imagehttp's, which reads it through http.go.
package server

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	utilclock "k8s.io/utils/clock"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/scrub"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/serverio"
)

// Phase is where an image stands; replicas tell each other theirs.
type Phase = imagelife.Phase

// The phases of an image, in the order a successful one goes through.
const (
	PhaseQueued      = imagelife.PhaseQueued
	PhaseDownloading = imagelife.PhaseDownloading
	PhaseVerifying   = imagelife.PhaseVerifying
	PhaseReady       = imagelife.PhaseReady
	PhaseFailed      = imagelife.PhaseFailed
)

// Store is the content-addressed storage the server fills and serves from.
type Store interface {
	List() []imagestore.Entry
	Open(sha256 osimage.SHA256) (*os.File, imagestore.Entry, error)
	// Resume opens the partial download of sha256, kept from an earlier
	// attempt or process, or starts one.
	Resume(sha256 osimage.SHA256) (*imagestore.Writer, error)
	// Partials lists the partial downloads kept; RemovePartial removes one.
	Partials() ([]imagestore.Partial, error)
	RemovePartial(sha256 osimage.SHA256) error
	Delete(sha256 osimage.SHA256) error
	Available() (uint64, error)
	Used() int64
	// Scrub re-hashes a stored image (package scrub).
	scrub.Store
}

// PullFunc downloads and verifies one image into dst, in one pass, and
// reports the verified md5 and size of the file written, and what was kept
// from an earlier pull into dst (a Writer from Store.Resume). progress gets
// the network bytes received and the total expected (0 when unknown).
type PullFunc func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress func(received, total int64)) (pull.Result, error)

// References tells which objects still reference an image. A deselected
// image that is referenced is kept on disk and served, however long ago it
// was deselected: Metal3 boots new and re-provisioned hosts from the
// templates that name it.
type References interface {
	// Synced is false until every reference is known; nothing is
	// collected before.
	Synced() bool
	// ReferencedBy names the objects that reference sha256, as KIND NS/NAME.
	ReferencedBy(sha256 osimage.SHA256) []string
}

// Publisher writes the served set, and the filenames of its images,
// wherever consumers read them.
type Publisher interface {
	Publish(ctx context.Context, out osimage.ServedOutput) error
}

// PublishedReader is a Publisher that can tell what it published last,
// even before this process published anything.
type PublishedReader interface {
	Published(ctx context.Context) (osimage.ServedSet, error)
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
	// download reserves; 0 keeps no margin (serve's --free-space-margin
	// keeps 1 GiB by default).
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
	Metrics             *imagehttp.Metrics
	// Replicas, when set, are the other servers of the Service: images
	// are filled from them first, one replica per image pulls from the
	// registry, and only the leader (SetLeader) publishes (replicas.go).
	Replicas replica.Replicas
	// PeerTimeout is how long a peer may show no progress before another
	// source takes over (0 means replica.DefaultPeerTimeout).
	PeerTimeout time.Duration
	// ClaimRule says when the first downloads may be claimed
	// (replica.ClaimRule).
	ClaimRule replica.ClaimRule
	// ReportPeer, when set, also reports a peer that failed.
	ReportPeer PeerReporter
	// ClientHold is how long a client's request for a selected image that
	// no replica holds verified yet waits for one before it is answered
	// 503 with Retry-After (0: at once; imagehttp.Endpoints.Hold). With
	// Replicas, a whole GET or HEAD of an image a peer holds verified is
	// answered from that peer (replica.Relay), within the hold too; a
	// range waits for the copy verified here.
	ClientHold time.Duration

	// ScrubInterval is how often each stored image is re-hashed, counted
	// from when it was last verified or scrubbed (0: never; package scrub).
	ScrubInterval time.Duration
	// ScrubRate bounds the bytes per second the scrub reads (0 means
	// DefaultScrubRate).
	ScrubRate int64

	// Now is the clock of dates (verified, deselected, retry at), for
	// tests.
	Now func() time.Time
	// Clock measures durations: the fill rules' stalls and rates, and the
	// peers' settle; nil is the real clock.
	Clock utilclock.WithTicker
}

// Defaults of Config, and of serve's flags.
const (
	DefaultConcurrency   = 2
	DefaultGCGrace       = time.Hour
	DefaultMaxImageSize  = servedset.DefaultMaxImageSize
	DefaultStallTimeout  = 60 * time.Second
	DefaultMinRate       = 64 << 10
	DefaultSendTimeout   = 2 * time.Minute
	DefaultScrubInterval = 7 * 24 * time.Hour
	DefaultScrubRate     = 50 << 20
)

// MinScrubInterval is the shortest ScrubInterval but 0 (off). The scrub
// looks for bit rot, which takes days; an interval of nanoseconds re-read
// small images in a loop and logged each pass.
const MinScrubInterval = time.Minute

// image is the server's record of one image, selected or kept on disk.
type image struct {
	servedset.Wanted
	// life is where the image stands; only transition changes it
	// (lifecycle.go).
	imagelife.Life
	received, total int64
	entry           imagestore.Entry
	cancel          context.CancelFunc
	// yield ends the download in progress with a cause that puts it back
	// in the queue (a *yieldError), without counting as a failure.
	yield            func(error)
	reservedForSpace int64
	// records is the round of attempts over a fleet need's records.
	records servedset.Records
	// keptBy is what "image kept" was last logged for, so that it is
	// logged once per change, not at every collection.
	keptBy string
	// source is where the copy comes from (replicas.go); writer is the
	// download in progress, which peers may stream.
	source string
	writer *imagestore.Writer
	// claiming: the registry pull of this replica is being confirmed
	// against its peers' states (replica.Filler).
	claiming bool
	// refused: the last download failed because its bytes did not verify
	// (isVerifyError), not because they could not be had; read with the
	// phase failed, which only the end of a download sets.
	refused bool
}

// Server selects, downloads, serves and publishes images.
type Server struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	images    map[osimage.SHA256]*image
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
	// inputs is the fate of the inputs read (guard.go).
	inputs serverio.Verdicts

	// With Replicas (replicas.go): what is known of the peers, whether
	// this replica leads, whether it was found ready once, and which
	// images were available at the last count (leader or not).
	view          *replica.View
	leader        bool
	readyOnce     bool
	lastAvailable map[osimage.SHA256]bool
	filler        *replica.Filler
	// relayClient reaches the peers that relay an image to a client.
	relayClient *http.Client
	// notify is closed at each change of an image's state (Changed).
	notifyMu sync.Mutex
	notify   chan struct{}
	scrubber *scrub.Scrubber
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
	cfg.ClientHold = max(cfg.ClientHold, 0)
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
	if cfg.Clock == nil {
		cfg.Clock = utilclock.RealClock{}
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = replica.DefaultPeerTimeout
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		images:  map[osimage.SHA256]*image{},
		kick:    make(chan struct{}, 1),
		changed: make(chan struct{}, 1),
		notify:  make(chan struct{}),
	}
	if cfg.Replicas != nil {
		s.view = replica.NewView(cfg.Replicas, cfg.Logger, cfg.Clock, cfg.ClaimRule)
		s.relayClient = &http.Client{Transport: replica.Transport()}
		s.filler = &replica.Filler{
			View: s.view, Puller: replica.NewPuller(cfg.PeerTimeout), Wait: cfg.PeerTimeout, Log: cfg.Logger,
			Registry: fill.Func{Label: fill.FromRegistry, F: func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
				return s.cfg.Pull(ctx, w, dst, progress)
			}},
			RegistryRule: s.registryRule, PeerRule: s.peerRule(), Started: s.setSource, Claim: s.setClaim, PeerFailed: s.reportPeer,
		}
	}
	now := cfg.Now()
	for _, e := range cfg.Store.List() {
		// Stored but not (yet) selected: kept for the grace period, so that
		// a restart never deletes what the next desired set still needs.
		s.images[e.SHA256] = &image{
			Wanted: servedset.Wanted{SHA256: e.SHA256, Desc: osimage.Descriptor{Filename: e.Filename}},
			Life:   imagelife.Life{Phase: PhaseReady, Stored: true, DeselectedAt: now},
			entry:  e,
			source: fill.FromStore,
		}
	}
	sc := scrub.Config{Images: scrubbedImages{s}, Store: cfg.Store, Interval: cfg.ScrubInterval, Rate: cfg.ScrubRate, Now: cfg.Now, Logger: cfg.Logger}
	if cfg.Metrics != nil {
		sc.ReadBytes, sc.Failures = cfg.Metrics.ScrubBytes, cfg.Metrics.ScrubFailures
	}
	s.scrubber = scrub.New(sc)
	if cfg.Metrics != nil {
		cfg.Metrics.Bind(s.report)
	}
	return s
}

// SetDesired replaces the set of images to serve. Newly selected images
// are queued, already stored ones are served at once, and deselected ones
// stop being served (a download of theirs is cancelled; their file is
// collected after the grace period). selectErr is what selection could not
// do, shown on the status page.
func (s *Server) SetDesired(wanted map[osimage.SHA256]servedset.Wanted, selectErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	s.ready = true
	s.selectErr = selectErr
	for sum, w := range wanted {
		img, ok := s.images[sum]
		if !ok {
			img = &image{Life: imagelife.Life{Phase: PhaseQueued}}
			s.images[sum] = img
			s.log.Info("image selected", "sha256", sum, "key", w.Key, "uri", w.Desc.URI, "selectedBy", w.SelectedBy)
		}
		img.Wanted = w
		img.keptBy = ""
		s.changeLocked(sum, img, imagelife.Selected{})
	}
	for sum, img := range s.images {
		if _, ok := wanted[sum]; ok || !img.Selected {
			continue
		}
		s.log.Info("image deselected", "sha256", sum, "key", img.Key, "phase", img.Phase)
		s.changeLocked(sum, img, imagelife.Deselected{At: now})
	}
	s.signal(s.kick)
	s.signal(s.changed)
}

func (s *Server) signal(ch chan struct{}) {
	if ch == s.changed {
		s.broadcast()
	}
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
	if s.view != nil {
		wg.Go(func() {
			s.view.Poll(ctx, nil, func() {
				s.signal(s.changed)
				s.signal(s.kick)
			})
		})
	}
	wg.Go(func() { s.scrubber.Run(ctx) })
	wg.Wait()
	return nil
}

// Statuses returns every known image, selected ones first, by key.
func (s *Server) Statuses() ([]imagehttp.Status, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]imagehttp.Status, 0, len(s.images))
	for _, sum := range slices.Sorted(maps.Keys(s.images)) {
		img := s.images[sum]
		size := img.Desc.Size
		if img.Stored {
			size = img.entry.Size
		}
		out = append(out, imagehttp.Status{
			SHA256: sum, Key: img.Key, Filename: img.Desc.Filename, Filenames: img.ServedAs(), URI: img.Desc.URI,
			Phase: img.Phase, Selected: img.Selected, Received: img.received, Total: img.total, Size: size,
			Reason: img.Reason, NextTry: img.NextTry, DeselectedAt: img.DeselectedAt,
			KeptBy: s.keptByLocked(sum, img), ReferencesUnknown: s.referencesUnknownLocked(img),
			CheckedAt: img.entry.CheckedAt(),
		})
	}
	// The selected first, then by key.
	slices.SortStableFunc(out, func(a, b imagehttp.Status) int {
		if a.Selected != b.Selected && a.Selected {
			return -1
		} else if a.Selected != b.Selected {
			return 1
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out, s.selectErr
}

// Ready says whether the server knows what to serve.
func (s *Server) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}
