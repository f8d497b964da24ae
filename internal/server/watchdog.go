package server

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// errDeselected ends the download of an image that is no longer selected.
var errDeselected = errors.New("the image was deselected")

// stallError ends a download that received no byte for StallTimeout.
type stallError struct{ timeout time.Duration }

func (e *stallError) Error() string {
	return fmt.Sprintf("stalled: no byte received for %s (--stall-timeout); the download was cut and is retried with backoff", e.timeout)
}

// gaveWayError ends a download too slow to keep its slot while other images
// wait for one.
type gaveWayError struct {
	received int64
	window   time.Duration
	minRate  int64
}

func (e *gaveWayError) Error() string {
	return fmt.Sprintf("gave way to the queue: %s in the last %s, below --min-rate %s/s; it is tried again after the images waiting",
		bytesIEC(e.received), e.window.Round(time.Millisecond), bytesIEC(e.minRate))
}

// sample is the network bytes a download had received at a time.
type sample struct {
	at       time.Time
	received int64
}

// rateWindow measures what a download received over its last window,
// never over less: a download is not judged on a slow start.
type rateWindow struct {
	window  time.Duration
	samples []sample
}

func newRateWindow(window time.Duration, now time.Time, received int64) *rateWindow {
	return &rateWindow{window: window, samples: []sample{{now, received}}}
}

// restart measures from (now, received) on.
func (w *rateWindow) restart(now time.Time, received int64) {
	w.samples = []sample{{now, received}}
}

// below records that received bytes had come by now, and says whether
// fewer than minRate bytes per second came over the last window (a whole
// window at least): slow, with the bytes and the time measured. A minRate
// of 0 is never below.
func (w *rateWindow) below(now time.Time, received, minRate int64) (slow bool, got int64, over time.Duration) {
	w.samples = append(w.samples, sample{now, received})
	// Keep one sample at least a window old: the rate is measured over a
	// whole window, never over a shorter start.
	for len(w.samples) > 1 && now.Sub(w.samples[1].at) >= w.window {
		w.samples = w.samples[1:]
	}
	base := w.samples[0]
	got, over = received-base.received, now.Sub(base.at)
	slow = minRate > 0 && over >= w.window && float64(got) < float64(minRate)*over.Seconds()
	return slow, got, over
}

// rateTick is how often a rate over window is sampled.
func rateTick(window time.Duration) time.Duration {
	return min(max(window/10, 10*time.Millisecond), time.Second)
}

// watch guards the download of sum until the returned stop is called: it
// cancels it with a *stallError when no byte came for StallTimeout, and
// with a *gaveWayError when fewer than MinRate × StallTimeout bytes came in
// the last StallTimeout while an image that never gave way waits for a
// slot. It measures on the monotonic clock, not Config.Now.
func (s *Server) watch(ctx context.Context, sum string, cancel context.CancelCauseFunc) (stop func()) {
	window := s.cfg.StallTimeout
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(rateTick(window))
		defer tick.Stop()
		rate := newRateWindow(window, time.Now(), 0)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			now := time.Now()
			s.mu.Lock()
			img, ok := s.images[sum]
			if !ok {
				s.mu.Unlock()
				return
			}
			received, lastByte, checking := img.received, img.lastByte, img.checkingKept
			waiting := s.cfg.MinRate > 0 && s.waitingLocked(sum)
			s.mu.Unlock()

			if now.Sub(lastByte) >= window {
				cancel(&stallError{timeout: window})
				return
			}
			if checking {
				// Reading back kept bytes, from the disk: the rate is
				// measured from the first network byte.
				rate.restart(now, received)
				continue
			}
			if slow, got, over := rate.below(now, received, s.cfg.MinRate); waiting && slow {
				cancel(&gaveWayError{received: got, window: over, minRate: s.cfg.MinRate})
				return
			}
		}
	}()
	var stopped bool
	return func() {
		if !stopped {
			stopped = true
			close(done)
			<-exited
		}
	}
}

// dueLocked says whether img needs a download now.
func (s *Server) dueLocked(img *image, now time.Time) bool {
	if !img.selected || img.stored || img.waitingForSpace {
		return false
	}
	return img.phase == PhaseQueued || img.phase == PhaseFailed && !now.Before(img.nextTry)
}

// waitingLocked says whether an image other than sum, that never gave way,
// waits for a download slot while every slot is taken.
func (s *Server) waitingLocked(sum string) bool {
	now := s.cfg.Now()
	busy, waiting := 0, false
	for other, img := range s.images {
		switch {
		case img.phase == PhaseDownloading || img.phase == PhaseVerifying:
			busy++
		case other != sum && !img.gaveWay && s.dueLocked(img, now):
			waiting = true
		}
	}
	return waiting && busy >= s.cfg.Concurrency
}
