package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/signature"
)

// The download queue: workers take the selected images that are not stored
// yet, most wanted first, and pull, verify and store each one, with
// backoff on failure.

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

// next claims the image that needs a download now, in claim order
// (claimsBefore): the management selection first, then the fleet's needs.
func (s *Server) next() (osimage.SHA256, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.claimableLocked() {
		return "", false
	}
	now := s.cfg.Now()
	var best *image
	inProgress := s.needsInProgressLocked()
	for _, img := range s.images {
		if !img.Due(now) {
			continue
		}
		if best == nil || claimsBefore(img, best, inProgress) {
			best = img
		}
	}
	if best == nil {
		return "", false
	}
	// Where this attempt fills from is chosen by fill; the source of an
	// earlier one would tell peers it keeps no layer (replicas.go).
	best.source, best.claiming = "", false
	best.received, best.total = 0, best.Desc.ArchiveSize
	// Another worker is kicked for the rest of the queue.
	s.changeLocked(best.SHA256, best, imagelife.Claimed{})
	return best.SHA256, true
}

func (s *Server) download(ctx context.Context, sum osimage.SHA256) {
	s.mu.Lock()
	img := s.images[sum]
	w := img.records.Next(img.Wanted)
	dctx, cancel := context.WithCancelCause(ctx)
	img.cancel = func() { cancel(errDeselected) }
	img.yield = func(err error) { cancel(err) }
	if !img.Selected {
		// Deselected between its claim by next and now, when there was no
		// download to cancel yet.
		cancel(errDeselected)
	}
	s.mu.Unlock()
	defer cancel(nil)
	s.log.Info("download started", "sha256", sum, "key", w.Key, "uri", w.Desc.URI, "attempt", img.Attempts)
	s.signal(s.changed)

	bound, need, err := w.Bounds(s.cfg.MaxImageSize)
	if err == nil {
		bound, err = s.reserveSpace(sum, w, bound, need)
	}
	var entry imagestore.Entry
	if err == nil {
		entry, err = s.pullInto(dctx, w, bound)
	}
	s.releaseSpace(sum)
	cause := context.Cause(dctx)

	s.mu.Lock()
	defer s.mu.Unlock()
	img.cancel, img.yield = nil, nil
	if err == nil {
		img.entry = entry
		if s.filler != nil {
			s.filler.Forget(sum)
		}
		img.records.Reset()
		s.log.Info("image ready", "sha256", sum, "key", w.Key, "bytes", entry.Size, "source", img.source)
		s.changeLocked(sum, img, imagelife.Downloaded{})
		return
	}
	end := imagelife.DownloadEnded{Why: imagelife.EndedFailed, Reason: err.Error()}
	switch {
	case !img.Selected:
		s.log.Info("download cancelled: image deselected", "sha256", sum, "key", w.Key)
		end.Why = imagelife.EndedByDeselection
	case ctx.Err() != nil:
		// Shutdown: not a failed attempt. The worker stops after this.
		s.log.Info("download interrupted by shutdown; its partial file is kept, to be continued at the next start", "sha256", sum, "key", w.Key)
		end.Why = imagelife.EndedByShutdown
	case errors.As(err, new(*spaceWait)):
		s.log.Info("download waits for space", "sha256", sum, "key", w.Key, "reason", err.Error())
		end.Why = imagelife.EndedWaitingForSpace
	case errors.As(err, new(*fill.SlowError)), errors.As(cause, new(*yieldError)):
		end.Why = imagelife.EndedGivingWay
		if slow := new(*fill.SlowError); errors.As(err, slow) {
			end.Reason = fmt.Sprintf("gave way to the queue: %v; it is tried again after the images waiting", *slow)
		} else {
			end.Reason = cause.Error()
		}
		s.log.Warn("download gave way to the queue", "sha256", sum, "key", w.Key, "reason", end.Reason)
	default:
		if next, ok := s.nextRecordLocked(img, w, err); ok {
			end.Why, end.Reason = imagelife.EndedForNextRecord, next
			break
		}
		end.RetryAt = s.cfg.Now().Add(s.backoff(img.Attempts))
		img.refused = isVerifyError(err)
		if s.cfg.Metrics != nil && img.refused {
			s.cfg.Metrics.VerifyFailures.Inc()
		}
		s.log.Error("download failed", "sha256", sum, "key", w.Key, "attempt", img.Attempts, "retryAt", end.RetryAt.Format(time.RFC3339), "error", err)
	}
	if end.Why == imagelife.EndedByShutdown || end.Why == imagelife.EndedGivingWay || end.Why == imagelife.EndedForNextRecord {
		// The next attempt starts its count again.
		img.received = 0
	}
	s.changeLocked(sum, img, end)
}

// pullInto downloads w into the store's partial file of its sha256,
// bounded to bound bytes, continuing what an earlier attempt (or process)
// kept there, and commits it once verified. A download refused for its
// content, or deselected, leaves nothing behind; one cut short otherwise
// (a shutdown, a network failure, a stall) keeps its partial file for the
// next attempt.
func (s *Server) pullInto(ctx context.Context, w servedset.Wanted, bound int64) (imagestore.Entry, error) {
	dst, err := s.cfg.Store.Resume(w.SHA256)
	if err != nil {
		return imagestore.Entry{}, err
	}
	dst.SetLimit(bound)
	progress := s.progressOf(w)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.InFlight.Inc()
		defer s.cfg.Metrics.InFlight.Dec()
	}
	s.mu.Lock()
	s.images[w.SHA256].writer = dst
	s.mu.Unlock()
	s.broadcast()
	res, source, err := s.fill(ctx, w, dst, progress)
	if res.KeptDiscarded != "" {
		s.log.Warn("partial download discarded; downloading again from byte 0", "sha256", w.SHA256, "key", w.Key, "reason", res.KeptDiscarded)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.KeptDiscarded.Inc()
		}
	}
	if res.Kept > 0 {
		s.log.Info("download continued from the partial file kept", "sha256", w.SHA256, "key", w.Key, "source", source, "keptBytes", res.Kept, "networkBytes", res.NetworkBytes)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.KeptBytes.Add(float64(res.Kept))
		}
	}
	md5, size := res.MD5, res.Size
	if errors.Is(err, imagestore.ErrLimit) && w.Desc.Size <= 0 {
		err = fmt.Errorf("%w; the image declares no size, so it is bounded by --max-image-size or, when less, by the space that was free (%s): declare its size, grow the data volume, or raise --max-image-size if it really is larger", err, osimage.FormatBytes(bound))
	}
	entry := imagestore.Entry{SHA256: w.SHA256, MD5: md5, Filename: w.Desc.Filename, Size: size, VerifiedAt: s.cfg.Now()}
	if err == nil {
		s.mu.Lock()
		s.changeLocked(w.SHA256, s.images[w.SHA256], imagelife.Verifying{})
		s.mu.Unlock()
		err = dst.Commit(entry)
	}
	if err != nil {
		if keepPartial(ctx, err) {
			_ = dst.Suspend()
			s.log.Info("partial download kept for the next attempt", "sha256", w.SHA256, "key", w.Key,
				"receivedBytes", res.Reached, "checkpointBytes", res.Checkpoint)
		} else {
			_ = dst.Abort()
		}
	}
	s.mu.Lock()
	s.images[w.SHA256].writer = nil
	s.mu.Unlock()
	if err != nil {
		return imagestore.Entry{}, err
	}
	return entry, nil
}

// progressOf is the pull.Progress of the download of w: it keeps the
// image's state (bytes received, phase) and the downloaded-bytes metric.
// The first report is where the download starts: bytes kept by an earlier
// attempt were not downloaded now. The fill's rule (fill.Rule) judges
// stalls and rates from the same reports.
func (s *Server) progressOf(w servedset.Wanted) pull.Progress {
	last, started := int64(0), false
	return func(received, total int64) {
		if !started {
			started, last = true, received
			if received > 0 {
				s.log.Info("download continues from the partial file kept, once it is checked", "sha256", w.SHA256, "key", w.Key, "keptBytes", received)
			}
		}
		s.mu.Lock()
		img := s.images[w.SHA256]
		// Peers wait for a download's first bytes and for its end.
		changed := (img.received == 0) != (received == 0)
		img.received = received
		if total > 0 {
			img.total = total
		}
		if img.total > 0 && received >= img.total && img.Phase == PhaseDownloading {
			s.changeLocked(w.SHA256, img, imagelife.Verifying{})
		}
		s.mu.Unlock()
		if changed {
			s.broadcast()
		}
		if s.cfg.Metrics != nil && received > last {
			s.cfg.Metrics.BytesDownloaded.Add(float64(received - last))
		}
		last = received
	}
}

// keepPartial says whether a download that ended with err keeps its
// partial file for the next attempt: not when its bytes were refused, nor
// when the image was deselected.
func keepPartial(ctx context.Context, err error) bool {
	return !isVerifyError(err) && !errors.Is(err, imagestore.ErrLimit) && !errors.Is(context.Cause(ctx), errDeselected)
}

func (s *Server) backoff(attempts int) time.Duration {
	d := s.cfg.RetryBase
	for i := 1; i < attempts && d < s.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, s.cfg.RetryMax)
}

// isVerifyError tells a refusal of the content (digests, sizes, the pinned
// manifest, the signature) from a failure to fetch it.
func isVerifyError(err error) bool {
	var v *pull.VerifyError
	var refused *signature.Error
	return errors.As(err, &v) || errors.As(err, &refused)
}

// forgetStored notes that the stored file of sum is gone (the store found
// it tampered with and dropped it), for reason: a selected image is queued
// again.
func (s *Server) forgetStored(sum osimage.SHA256, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok || !img.Stored {
		return
	}
	img.entry = imagestore.Entry{}
	s.changeLocked(sum, img, imagelife.StoredLost{Reason: reason})
}

// errDeselected ends the download of an image that is no longer selected.
var errDeselected = errors.New("the image was deselected")

// waitingLocked says whether an image other than sum, that never gave way,
// waits for a download slot while every slot is taken.
func (s *Server) waitingLocked(sum osimage.SHA256) bool {
	now := s.cfg.Now()
	busy, waiting := 0, false
	for other, img := range s.images {
		switch {
		case img.Phase == PhaseDownloading || img.Phase == PhaseVerifying:
			busy++
		case other != sum && !img.GaveWay && img.Due(now):
			waiting = true
		}
	}
	return waiting && busy >= s.cfg.Concurrency
}
