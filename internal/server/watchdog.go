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
		tick := time.NewTicker(min(max(window/10, 10*time.Millisecond), time.Second))
		defer tick.Stop()
		started := time.Now()
		samples := []sample{{started, 0}}
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
				samples = []sample{{now, received}}
				continue
			}
			samples = append(samples, sample{now, received})
			// Keep one sample at least a window old: the rate is measured
			// over a whole window, never over a shorter start.
			for len(samples) > 1 && now.Sub(samples[1].at) >= window {
				samples = samples[1:]
			}
			base := samples[0]
			elapsed := now.Sub(base.at)
			if waiting && elapsed >= window && float64(received-base.received) < float64(s.cfg.MinRate)*elapsed.Seconds() {
				cancel(&gaveWayError{received: received - base.received, window: elapsed, minRate: s.cfg.MinRate})
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
