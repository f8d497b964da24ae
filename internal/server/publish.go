package server

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Publishing: the served set is written to the Publisher whenever it
// changes.

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
	out := osimage.ServedOutput{Set: s.servedLocked(), Filenames: osimage.ServedFilenames{}, OCI: osimage.ServedOCI{}, Refused: s.refusedLocked()}
	for sum, entry := range out.Set {
		img := s.images[sum]
		out.Filenames[sum] = img.ServedAs()
		// Its manifest is of its sha256 and size: the verified size where
		// this replica holds it, else the declared one (the same, or it
		// would not have verified).
		size := img.entry.Size
		if !img.Stored {
			size = img.Desc.Size
		}
		if entry.Available && size > 0 {
			_, manifest := osimage.OCIManifest(sum, size)
			out.OCI[sum] = osimage.OCIServed{Repository: osimage.OCIRepository(sum), Manifest: manifest}
		}
	}
	if len(out.Refused) > 0 {
		// The refusals of the fleet's needs never keep the served set
		// from its ConfigMap: what does not fit beside it is left out.
		if _, err := out.ConfigMapData("the served set"); errors.As(err, new(*osimage.SizeError)) {
			s.log.Error("the refusals of the fleet's needs are not published: the served set leaves no room for them", "refusals", len(out.Refused))
			out.Refused = nil
		}
	}
	return out
}

func (s *Server) servedLocked() osimage.ServedSet {
	out := osimage.ServedSet{}
	for sum, img := range s.images {
		if img.Selected {
			out[sum] = osimage.ServedImage{Available: s.availableLocked(sum, img), ImageKey: img.Key}
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
		s.inheritAvailability(ctx)
		s.mu.Lock()
		counts := s.ready && s.countsLocked()
		ready := counts && s.publishesLocked()
		served := s.outputLocked()
		if counts {
			s.lastAvailable = map[osimage.SHA256]bool{}
			for sum, e := range served.Set {
				s.lastAvailable[sum] = e.Available
			}
		}
		same := !s.republish && s.published.Set != nil && served.Equal(s.published)
		if ready && !same {
			s.publishing, s.republish = served, false
		}
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

// outputObserved is told what the output holds (OutputWatcher): when it
// no longer holds what this server gave the Publisher last (a ConfigMap
// deleted, or edited by hand), that is published again. Keys the server
// does not write are left to whoever wrote them.
func (s *Server) outputObserved(data map[string]string, exists bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.publishesLocked() || s.publishing.Set == nil || s.republish {
		return
	}
	want, err := s.publishing.ConfigMapData("the served set")
	if err != nil {
		return // refused by the Publisher too: nothing was written
	}
	var drifted []string
	for k, v := range want {
		if got, ok := data[k]; !ok || got != v {
			drifted = append(drifted, k)
		}
	}
	if len(drifted) == 0 {
		return
	}
	slices.Sort(drifted)
	if !exists {
		s.log.Warn("the published served set was deleted; publishing it again")
	} else {
		s.log.Warn("the published served set was changed by another writer; publishing it again", "keys", drifted)
	}
	s.republish = true
	s.signal(s.changed)
}

// countsLocked says whether this replica can count which images are
// available: one server without replicas always can. With replicas, it
// needs its peers' states read once since it started, and a replica,
// itself or a peer, ready behind the Service. Before its first read, a
// replica just started (and leading at once, the Lease released by the
// one it replaces) would say "not available" of every image its peers
// hold; with no replica ready (every one starting again after a node
// restarted), none can vouch for an image nor take one back. Either would
// be a flap that fails every render; what was published stays until then.
func (s *Server) countsLocked() bool {
	if s.view == nil {
		return true
	}
	r := s.cfg.Replicas
	return s.view.Known() && (r.SelfReady() || len(r.Ready()) > 0)
}

// inheritAvailability gives a replica that leads before it ever counted
// the count its predecessor published: a ready peer whose state cannot be
// read then keeps what the fleet was told was available (View.Available's
// rule), as it would have had this replica counted it before.
func (s *Server) inheritAvailability(ctx context.Context) {
	r, ok := s.cfg.Publisher.(PublishedReader)
	s.mu.Lock()
	inherit := ok && s.view != nil && s.leader && s.lastAvailable == nil
	s.mu.Unlock()
	if !inherit {
		return
	}
	published, err := r.Published(ctx)
	if err != nil && ctx.Err() != nil {
		return // shutting down: nothing is published any more
	}
	if err != nil {
		s.log.Warn("the served set published by the previous leader cannot be read; a peer whose state cannot be read holds nothing until this replica counted once", "error", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastAvailable == nil {
		s.lastAvailable = map[osimage.SHA256]bool{}
		for sum, e := range published {
			s.lastAvailable[sum] = e.Available
		}
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
