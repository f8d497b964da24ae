package server

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// Garbage collection: stored images deselected for longer than the grace
// period, and referenced by no Metal3 object, are deleted.

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
	var victims []osimage.SHA256
	for sum, img := range s.images {
		if !img.Selected && img.Stored && now.Sub(img.DeselectedAt) >= s.cfg.GCGrace {
			victims = append(victims, sum)
		}
	}
	s.mu.Unlock()
	if refs := s.cfg.References; refs != nil && len(victims) > 0 {
		if !refs.Synced() {
			s.log.Warn("garbage collection postponed: the Metal3 objects that may reference images are not all known yet", "candidates", len(victims))
			return
		}
		victims = slices.DeleteFunc(victims, func(sum osimage.SHA256) bool {
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
		if img, ok := s.images[sum]; ok {
			img.entry = imagestore.Entry{}
			s.changeLocked(sum, img, imagelife.Collected{})
		}
		s.mu.Unlock()
		s.log.Info("image deleted after the grace period", "sha256", sum)
	}
	s.collectPartials()
	s.mu.Lock()
	s.gcLastPass = now
	s.mu.Unlock()
}

// collectPartials removes the partial downloads, kept across restarts, of
// images no longer selected: a download in progress is cancelled (and its
// partial removed) when its image is deselected, but one kept by an earlier
// process is known only here.
func (s *Server) collectPartials() {
	partials, err := s.cfg.Store.Partials()
	if err != nil {
		s.log.Error("listing the partial downloads failed", "error", err)
		return
	}
	for _, p := range partials {
		s.mu.Lock()
		img, ok := s.images[p.SHA256]
		wanted := ok && img.Selected && !img.Stored
		s.mu.Unlock()
		if wanted {
			continue
		}
		if err := s.cfg.Store.RemovePartial(p.SHA256); err != nil {
			s.log.Error("removing a partial download failed", "sha256", p.SHA256, "error", err)
			continue
		}
		s.log.Info("partial download removed: its image is not selected", "sha256", p.SHA256, "bytes", p.Bytes)
	}
}

// LastCollection is when the last complete garbage-collection pass began
// (zero before the first): a pass postponed, because no desired set or not
// every reference is known yet, does not count.
func (s *Server) LastCollection() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gcLastPass
}

// keptByLocked names what keeps a deselected, stored image.
func (s *Server) keptByLocked(sum osimage.SHA256, img *image) []string {
	if img.Selected || !img.Stored || s.cfg.References == nil {
		return nil
	}
	return s.cfg.References.ReferencedBy(sum)
}

// referencesUnknownLocked says whether a deselected, stored image may be
// referenced by a Metal3 object not seen yet (the tracker has not listed
// them all, as just after a start): such an image stays served, as it
// stays stored, since a host may be booting from it.
func (s *Server) referencesUnknownLocked(img *image) bool {
	return !img.Selected && img.Stored && s.cfg.References != nil && !s.cfg.References.Synced()
}
