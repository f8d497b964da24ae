// Package scrub re-hashes what the image server stores, to find bit rot
// and tampering: one image at a time, each stored image once per
// interval, counted from when it was last verified or scrubbed (a time
// kept in the store's metadata beside the image, so that a restart neither
// skips a scrub that was due nor repeats one that was done; a time after
// now is due now). The reads are paced by a token bucket of Rate bytes per
// second, in chunks of imagestore.ScrubChunk, and no lock of the server is
// held while hashing: serving reads the same files through sendfile,
// untouched.
//
// An image found changed is dropped by the store before anything else (so
// that its download can commit again); the server, told through Images,
// then takes it out of service and queues it for download like any image
// not stored.
package scrub

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// recheck bounds how long the scrub sleeps with nothing due, so that an
// image stored meanwhile, or a clock that jumped, is seen.
const recheck = time.Minute

// maxFailures is how many failures the status page lists.
const maxFailures = 10

// Stored is one image stored and ready, as the scrub picks among them.
type Stored struct {
	SHA256 osimage.SHA256
	Key    string
	Entry  imagestore.Entry
}

// Images is what the scrub asks of the image server.
type Images interface {
	// Stored lists the images stored and ready to serve.
	Stored() []Stored
	// Scrubbed takes the entry of an image found intact (its new check
	// time), if the image is still stored.
	Scrubbed(sum osimage.SHA256, e imagestore.Entry)
	// Tampered says that the store dropped sum, found changed: it is no
	// longer served, and is downloaded again.
	Tampered(sum osimage.SHA256, reason string)
}

// Store re-hashes a stored image; a mismatch drops it and wraps
// imagestore.ErrTampered (imagestore.Store.Scrub).
type Store interface {
	Scrub(ctx context.Context, sha256 osimage.SHA256, throttle func(ctx context.Context, n int) error, now func() time.Time) (imagestore.Entry, error)
}

// Config is what a Scrubber needs.
type Config struct {
	Images Images
	Store  Store
	// Interval is how often each stored image is re-hashed (0: never).
	Interval time.Duration
	// Rate bounds the bytes per second read (must be > 0 when Interval is).
	Rate int64
	// Now is the clock of dates (checks, failures).
	Now    func() time.Time
	Logger *slog.Logger
	// ReadBytes and Failures, when set, count the bytes read and the
	// images found changed.
	ReadBytes, Failures prometheus.Counter
}

// Scrubber runs the scrub and knows its state.
type Scrubber struct {
	cfg Config

	mu sync.Mutex
	// current is the sha256 being scrubbed, or "".
	current osimage.SHA256
	// upToDate is when the scrub last found every stored image checked
	// within the interval.
	upToDate time.Time
	// bytes is what the scrub has read since the start.
	bytes int64
	// failures are the latest images found changed, newest last.
	failures []Failure
	// retryAt holds images whose scrub failed for another reason (I/O):
	// they are tried again then, not in a loop.
	retryAt map[osimage.SHA256]time.Time
}

// New returns a Scrubber over cfg.
func New(cfg Config) *Scrubber {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Scrubber{cfg: cfg}
}

// Failure is an image the scrub found changed.
type Failure struct {
	At     time.Time
	SHA256 osimage.SHA256
	Key    string
	Reason string
}

// Status is the scrub as the status page shows it.
type Status struct {
	Enabled  bool
	Interval time.Duration
	Rate     int64
	Current  osimage.SHA256
	UpToDate time.Time
	Bytes    int64
	Failures []Failure
}

// Status returns the state of the scrub.
func (s *Scrubber) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{
		Enabled: s.cfg.Interval > 0, Interval: s.cfg.Interval, Rate: s.cfg.Rate,
		Current: s.current, UpToDate: s.upToDate, Bytes: s.bytes,
		Failures: append([]Failure(nil), s.failures...),
	}
}

// Run scrubs until ctx ends; with no interval it returns at once.
func (s *Scrubber) Run(ctx context.Context) {
	if s.cfg.Interval <= 0 {
		return
	}
	// The burst is one chunk: the scrub never reads ahead of its rate by
	// more than that.
	limit := rate.NewLimiter(rate.Limit(s.cfg.Rate), imagestore.ScrubChunk)
	throttle := func(ctx context.Context, n int) error {
		if err := limit.WaitN(ctx, n); err != nil {
			return err
		}
		s.mu.Lock()
		s.bytes += int64(n)
		s.mu.Unlock()
		if s.cfg.ReadBytes != nil {
			s.cfg.ReadBytes.Add(float64(n))
		}
		return nil
	}
	for ctx.Err() == nil {
		img, wait := s.next()
		if img.SHA256 != "" {
			s.scrubOne(ctx, img, throttle)
			continue
		}
		t := time.NewTimer(min(wait, recheck))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// next picks the stored image checked longest ago, if it is due; else it
// says how long until one is.
func (s *Scrubber) next() (Stored, time.Duration) {
	stored := s.cfg.Images.Stored()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	var best Stored
	var bestDue time.Time
	for _, img := range stored {
		due := s.due(img.Entry, now)
		if retry, ok := s.retryAt[img.SHA256]; ok {
			due = retry
		}
		if best.SHA256 == "" || due.Before(bestDue) {
			best, bestDue = img, due
		}
	}
	if best.SHA256 != "" && !now.Before(bestDue) {
		s.current = best.SHA256
		if best.Entry.CheckedAt().After(now) {
			s.cfg.Logger.Warn("scrub due now: the image's last check is dated in the future (a clock set back, or metadata restored or edited)",
				"sha256", best.SHA256, "key", best.Key, "checkedAt", best.Entry.CheckedAt().Format(time.RFC3339), "now", now.Format(time.RFC3339))
		}
		return best, 0
	}
	s.upToDate = now
	if best.SHA256 == "" {
		// An image stored from now on is due an interval after it.
		return Stored{}, s.cfg.Interval
	}
	return Stored{}, bestDue.Sub(now)
}

// due is when the scrub of e falls due: an interval after its last check,
// or now when that check is dated after now. A date in the future would
// put the scrub off by as much, for ever when it is far enough.
func (s *Scrubber) due(e imagestore.Entry, now time.Time) time.Time {
	checked := e.CheckedAt()
	if checked.After(now) {
		return now
	}
	return checked.Add(s.cfg.Interval)
}

func (s *Scrubber) scrubOne(ctx context.Context, img Stored, throttle func(context.Context, int) error) {
	start := time.Now()
	sum, key := img.SHA256, img.Key
	entry, err := s.cfg.Store.Scrub(ctx, sum, throttle, s.cfg.Now)
	s.mu.Lock()
	s.current = ""
	delete(s.retryAt, sum)
	s.mu.Unlock()
	switch {
	case err == nil:
		s.cfg.Images.Scrubbed(sum, entry)
		s.cfg.Logger.Info("image scrubbed: its content matches its sha256", "sha256", sum, "key", key, "bytes", entry.Size, "seconds", time.Since(start).Seconds())
	case ctx.Err() != nil:
	case errors.Is(err, imagestore.ErrTampered):
		// The store has removed the file already: what is left is to stop
		// serving it and to fetch it again, before the failure is reported.
		s.cfg.Images.Tampered(sum, "the scrub found the stored file changed ("+err.Error()+"); downloading it again")
		s.cfg.Logger.Warn("scrub failed: the stored image no longer matches its sha256; it is no longer served, and is downloaded again", "sha256", sum, "key", key, "error", err)
		s.mu.Lock()
		s.failures = append(s.failures, Failure{At: s.cfg.Now(), SHA256: sum, Key: key, Reason: err.Error()})
		if len(s.failures) > maxFailures {
			s.failures = s.failures[1:]
		}
		s.mu.Unlock()
		if s.cfg.Failures != nil {
			s.cfg.Failures.Inc()
		}
	case errors.Is(err, imagestore.ErrNotFound):
		// Collected while it was read.
	default:
		// An I/O error says nothing of the content: keep the image, and
		// try again later rather than in a loop.
		s.mu.Lock()
		if s.retryAt == nil {
			s.retryAt = map[osimage.SHA256]time.Time{}
		}
		s.retryAt[sum] = s.cfg.Now().Add(min(s.cfg.Interval, time.Hour))
		s.mu.Unlock()
		s.cfg.Logger.Error("scrub could not read a stored image; it stays served, and is scrubbed again later", "sha256", sum, "key", key, "error", err)
	}
}
