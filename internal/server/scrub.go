package server

import (
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/scrub"
)

// scrubbedImages is the server as package scrub sees it: the images stored
// and ready, and what becomes of one once scrubbed.
type scrubbedImages struct{ s *Server }

func (v scrubbedImages) Stored() []scrub.Stored {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []scrub.Stored
	for sum, img := range s.images {
		if img.Stored && img.Phase == PhaseReady {
			out = append(out, scrub.Stored{SHA256: sum, Key: img.Key, Entry: img.entry})
		}
	}
	return out
}

func (v scrubbedImages) Scrubbed(sum osimage.SHA256, e imagestore.Entry) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if img, ok := s.images[sum]; ok && img.Stored {
		img.entry = e
	}
}

func (v scrubbedImages) Tampered(sum osimage.SHA256, reason string) { v.s.forgetStored(sum, reason) }

// ScrubStatus returns the state of the scrub.
func (s *Server) ScrubStatus() scrub.Status { return s.scrubber.Status() }
