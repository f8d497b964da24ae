package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/selection"
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
func (s *Server) next() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.claimableLocked() {
		return "", false
	}
	now := s.cfg.Now()
	var best *image
	inProgress := s.needsInProgressLocked()
	for _, img := range s.images {
		if !s.dueLocked(img, now) {
			continue
		}
		if best == nil || claimsBefore(img, best, inProgress) {
			best = img
		}
	}
	if best == nil {
		return "", false
	}
	best.phase = PhaseDownloading
	// Where this attempt fills from is chosen by fill; the source of an
	// earlier one would tell peers it keeps no layer (replicas.go).
	best.source = ""
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
	w := img.attempt()
	dctx, cancel := context.WithCancelCause(ctx)
	img.cancel = func() { cancel(errDeselected) }
	img.yield = func(err error) { cancel(err) }
	if !img.selected {
		// Deselected between its claim by next and now, when there was no
		// download to cancel yet.
		cancel(errDeselected)
	}
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
	img.cancel, img.yield = nil, nil
	switch {
	case err == nil:
		img.phase = PhaseReady
		img.stored = true
		img.entry = entry
		img.attempts = 0
		img.gaveWay = false
		img.badPeers = nil
		img.recordFailed = nil
		s.log.Info("image ready", "sha256", sum, "key", w.Key, "bytes", entry.Size, "source", img.source)
	case !img.selected:
		s.log.Info("download cancelled: image deselected", "sha256", sum, "key", w.Key)
		delete(s.images, sum)
	case ctx.Err() != nil:
		// Shutdown: not a failed attempt. The worker stops after this.
		img.phase = PhaseQueued
		img.attempts--
		img.received = 0
		s.log.Info("download interrupted by shutdown; its partial file is kept, to be continued at the next start", "sha256", sum, "key", w.Key)
	case errors.As(err, new(*spaceWait)):
		img.phase = PhaseQueued
		img.attempts--
		img.reason = err.Error()
		s.log.Info("download waits for space", "sha256", sum, "key", w.Key, "reason", err.Error())
	case errors.As(cause, new(*gaveWayError)), errors.As(cause, new(*yieldError)):
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
		if s.nextRecordLocked(img, w, err) {
			break
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

// pullInto downloads w into the store's partial file of its sha256,
// bounded to bound bytes, continuing what an earlier attempt (or process)
// kept there, and commits it once verified. A download refused for its
// content, or deselected, leaves nothing behind; one cut short otherwise
// (a shutdown, a network failure, a stall) keeps its partial file for the
// next attempt. pulled is called once the network part is over.
func (s *Server) pullInto(ctx context.Context, w selection.Wanted, bound int64, pulled func()) (imagestore.Entry, error) {
	dst, err := s.cfg.Store.Resume(w.SHA256)
	if err != nil {
		return imagestore.Entry{}, err
	}
	dst.SetLimit(bound)
	progress := s.progressOf(w)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.inFlight.Inc()
		defer s.cfg.Metrics.inFlight.Dec()
	}
	s.mu.Lock()
	s.images[w.SHA256].writer = dst
	s.mu.Unlock()
	res, source, err := s.fill(ctx, w, dst, progress)
	pulled()
	if res.KeptDiscarded != "" {
		s.log.Warn("partial download discarded; downloading again from byte 0", "sha256", w.SHA256, "key", w.Key, "reason", res.KeptDiscarded)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.keptDiscarded.Inc()
		}
	}
	if res.Kept > 0 {
		s.log.Info("download continued from the partial file kept", "sha256", w.SHA256, "key", w.Key, "source", source, "keptBytes", res.Kept, "networkBytes", res.NetworkBytes)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.keptBytes.Add(float64(res.Kept))
		}
	}
	md5, size := res.MD5, res.Size
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
// image's state (bytes received, last sign of life, phase) and the
// downloaded-bytes metric. The first report is where the download starts:
// bytes kept by an earlier attempt were not downloaded now, and until a
// report says otherwise they are read back and checked.
func (s *Server) progressOf(w selection.Wanted) func(received, total int64) {
	last, started, checking := int64(0), false, false
	return func(received, total int64) {
		if !started {
			started, last = true, received
			checking = received > 0
			if checking {
				s.log.Info("download continues from the partial file kept, once it is checked", "sha256", w.SHA256, "key", w.Key, "keptBytes", received)
			}
		} else if checking && received != last {
			checking = false
		}
		s.mu.Lock()
		img := s.images[w.SHA256]
		if received > img.received || checking {
			img.lastByte = time.Now()
		}
		img.checkingKept = checking
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
func (s *Server) forgetStored(sum, reason string) {
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
	img.reason = reason
	s.signal(s.kick)
	s.signal(s.changed)
}
