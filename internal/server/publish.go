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
	out := osimage.ServedOutput{Set: s.servedLocked(), Filenames: osimage.ServedFilenames{}, Refused: s.refusedLocked()}
	for sum := range out.Set {
		out.Filenames[sum] = s.images[sum].ServedAs()
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
		s.mu.Lock()
		ready := s.ready && s.publishesLocked() && s.someReplicaReadyLocked()
		served := s.outputLocked()
		s.lastAvailable = map[osimage.SHA256]bool{}
		for sum, e := range served.Set {
			s.lastAvailable[sum] = e.Available
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

// someReplicaReadyLocked says whether any replica, this one or a peer, is
// ready behind the Service. With none (every replica starting again, after
// a node restarted), none can vouch for an image nor take one back:
// availableLocked would say "not available" of every image, a flap that
// fails every render until a replica is ready. What was published stays
// until then. One server without replicas vouches for itself.
func (s *Server) someReplicaReadyLocked() bool {
	r := s.cfg.Replicas
	return r == nil || r.SelfReady() || len(r.Ready()) > 0
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
