package server

import (
	"context"
	"errors"
	"time"

	"golang.org/x/time/rate"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// The scrub: one image at a time, each stored image is re-hashed once per
// ScrubInterval, counted from when it was last verified or scrubbed (a
// time kept in the store's metadata beside the image, so that a restart
// neither skips a scrub that was due nor repeats one that was done; a time
// after now is due now). The
// reads are paced by a token bucket of ScrubRate bytes per second, in
// chunks of imagestore.ScrubChunk, and no lock of the server is held while
// hashing: serving reads the same files through sendfile, untouched.
//
// An image found changed is dropped by the store before anything else (so
// that its download can commit again), then taken out of service and
// queued for download like any image not stored: the download queue, and
// whatever source it pulls from (the registry, a peer), fetches it again.

// scrubRecheck bounds how long the scrub sleeps with nothing due, so that
// an image stored meanwhile, or a clock that jumped, is seen.
const scrubRecheck = time.Minute

// maxScrubFailures is how many failures the status page lists.
const maxScrubFailures = 10

// scrubState is what the server knows of its scrub.
type scrubState struct {
	// current is the sha256 being scrubbed, or "".
	current osimage.SHA256
	// upToDate is when the scrub last found every stored image checked
	// within the interval.
	upToDate time.Time
	// bytes is what the scrub has read since the start.
	bytes int64
	// failures are the latest images found changed, newest last.
	failures []ScrubFailure
	// retryAt holds images whose scrub failed for another reason (I/O):
	// they are tried again then, not in a loop.
	retryAt map[osimage.SHA256]time.Time
}

// ScrubFailure is an image the scrub found changed.
type ScrubFailure struct {
	At     time.Time
	SHA256 osimage.SHA256
	Key    string
	Reason string
}

// ScrubStatus is the scrub as the status page shows it.
type ScrubStatus struct {
	Enabled  bool
	Interval time.Duration
	Rate     int64
	Current  osimage.SHA256
	UpToDate time.Time
	Bytes    int64
	Failures []ScrubFailure
}

// ScrubStatus returns the state of the scrub.
func (s *Server) ScrubStatus() ScrubStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ScrubStatus{
		Enabled: s.cfg.ScrubInterval > 0, Interval: s.cfg.ScrubInterval, Rate: s.cfg.ScrubRate,
		Current: s.scrub.current, UpToDate: s.scrub.upToDate, Bytes: s.scrub.bytes,
		Failures: append([]ScrubFailure(nil), s.scrub.failures...),
	}
}

func (s *Server) scrubLoop(ctx context.Context) {
	if s.cfg.ScrubInterval <= 0 {
		return
	}
	// The burst is one chunk: the scrub never reads ahead of its rate by
	// more than that.
	limit := rate.NewLimiter(rate.Limit(s.cfg.ScrubRate), imagestore.ScrubChunk)
	throttle := func(ctx context.Context, n int) error {
		if err := limit.WaitN(ctx, n); err != nil {
			return err
		}
		s.mu.Lock()
		s.scrub.bytes += int64(n)
		s.mu.Unlock()
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.scrubBytes.Add(float64(n))
		}
		return nil
	}
	for ctx.Err() == nil {
		sum, wait := s.nextScrub()
		if sum != "" {
			s.scrubOne(ctx, sum, throttle)
			continue
		}
		t := time.NewTimer(min(wait, scrubRecheck))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// nextScrub picks the stored image checked longest ago, if it is due; else
// it says how long until one is.
func (s *Server) nextScrub() (osimage.SHA256, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	var best osimage.SHA256
	var bestDue time.Time
	for sum, img := range s.images {
		if !img.Stored || img.Phase != PhaseReady {
			continue
		}
		due := s.scrubDue(img.entry, now)
		if retry, ok := s.scrub.retryAt[sum]; ok {
			due = retry
		}
		if best == "" || due.Before(bestDue) {
			best, bestDue = sum, due
		}
	}
	if best != "" && !now.Before(bestDue) {
		s.scrub.current = best
		if img := s.images[best]; img.entry.CheckedAt().After(now) {
			s.log.Warn("scrub due now: the image's last check is dated in the future (a clock set back, or metadata restored or edited)",
				"sha256", best, "key", img.Key, "checkedAt", img.entry.CheckedAt().Format(time.RFC3339), "now", now.Format(time.RFC3339))
		}
		return best, 0
	}
	s.scrub.upToDate = now
	if best == "" {
		// An image stored from now on is due an interval after it.
		return "", s.cfg.ScrubInterval
	}
	return "", bestDue.Sub(now)
}

// scrubDue is when the scrub of e falls due: an interval after its last
// check, or now when that check is dated after now. A date in the future
// would put the scrub off by as much, for ever when it is far enough.
func (s *Server) scrubDue(e imagestore.Entry, now time.Time) time.Time {
	checked := e.CheckedAt()
	if checked.After(now) {
		return now
	}
	return checked.Add(s.cfg.ScrubInterval)
}

func (s *Server) scrubOne(ctx context.Context, sum osimage.SHA256, throttle func(context.Context, int) error) {
	start := time.Now()
	entry, err := s.cfg.Store.Scrub(ctx, sum, throttle, s.cfg.Now)
	s.mu.Lock()
	s.scrub.current = ""
	delete(s.scrub.retryAt, sum)
	img, known := s.images[sum]
	key := ""
	if known {
		key = img.Key
	}
	switch {
	case err == nil:
		if known && img.Stored {
			img.entry = entry
		}
		s.mu.Unlock()
		s.log.Info("image scrubbed: its content matches its sha256", "sha256", sum, "key", key, "bytes", entry.Size, "seconds", time.Since(start).Seconds())
	case ctx.Err() != nil:
		s.mu.Unlock()
	case errors.Is(err, imagestore.ErrTampered):
		s.mu.Unlock()
		// The store has removed the file already: what is left is to stop
		// serving it and to fetch it again, before the failure is reported.
		s.forgetStored(sum, "the scrub found the stored file changed ("+err.Error()+"); downloading it again")
		s.log.Warn("scrub failed: the stored image no longer matches its sha256; it is no longer served, and is downloaded again", "sha256", sum, "key", key, "error", err)
		s.mu.Lock()
		s.scrub.failures = append(s.scrub.failures, ScrubFailure{At: s.cfg.Now(), SHA256: sum, Key: key, Reason: err.Error()})
		if len(s.scrub.failures) > maxScrubFailures {
			s.scrub.failures = s.scrub.failures[1:]
		}
		s.mu.Unlock()
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.scrubFailures.Inc()
		}
	case errors.Is(err, imagestore.ErrNotFound):
		// Collected while it was read.
		s.mu.Unlock()
	default:
		// An I/O error says nothing of the content: keep the image, and
		// try again later rather than in a loop.
		if s.scrub.retryAt == nil {
			s.scrub.retryAt = map[osimage.SHA256]time.Time{}
		}
		s.scrub.retryAt[sum] = s.cfg.Now().Add(min(s.cfg.ScrubInterval, time.Hour))
		s.mu.Unlock()
		s.log.Error("scrub could not read a stored image; it stays served, and is scrubbed again later", "sha256", sum, "key", key, "error", err)
	}
}
