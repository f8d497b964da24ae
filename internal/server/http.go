package server

import (
	"errors"
	"net/http"
	"os"
	"slices"

	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/ocidist"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// The server as its HTTP face (package imagehttp) reads it.

// Handler serves the images, their checksum files, the status page, health
// and metrics (imagehttp.Endpoints).
func (s *Server) Handler() http.Handler { return s.endpoints().Handler() }

// HTTPServer is an http.Server for Handler, with the timeouts of a server
// facing many clients (imagehttp.Endpoints.Server).
func (s *Server) HTTPServer() *http.Server { return s.endpoints().Server() }

func (s *Server) endpoints() imagehttp.Endpoints {
	e := imagehttp.Endpoints{Images: servedImages{s}, Metrics: s.cfg.Metrics, SendTimeout: s.cfg.SendTimeout, Now: s.cfg.Now, Log: s.log}
	e.Registry = ocidist.Registry{Images: servedImages{s}, ServeBlob: e.ServeStored, RetryAfterSeconds: imagehttp.RetryAfterSeconds}.Handler()
	return e
}

// servedImages implements imagehttp.Images.
type servedImages struct{ s *Server }

func (v servedImages) Lookup(sum osimage.SHA256) (imagehttp.Image, bool) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok {
		return imagehttp.Image{}, false
	}
	served := img.Selected || s.referencesUnknownLocked(img) || len(s.keptByLocked(sum, img)) > 0
	return imagehttp.Image{Served: served, Stored: img.Stored, Phase: img.Phase, Filenames: img.ServedAs(), MD5: img.entry.MD5, VerifiedAt: img.entry.VerifiedAt}, true
}

// Served lists the images served, for the OCI distribution face: those
// the image URLs serve, with a tag per key of each selected one.
func (v servedImages) Served() []ocidist.Image {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ocidist.Image, 0, len(s.images))
	for sum, img := range s.images {
		if !img.Selected && !s.referencesUnknownLocked(img) && len(s.keptByLocked(sum, img)) == 0 {
			continue
		}
		oi := ocidist.Image{SHA256: sum, Ready: img.Stored && img.Phase == PhaseReady, Size: img.entry.Size, DiskFormat: img.Image.Get(osimage.FieldImageFormat)}
		if img.Selected {
			oi.Tags = tagsOf(img.Wanted)
		}
		out = append(out, oi)
	}
	return out
}

// tagsOf are the keys of w that can be tags.
func tagsOf(w servedset.Wanted) []string {
	keys := []string{w.Key}
	for _, r := range w.Records {
		keys = append(keys, r.Key)
	}
	var tags []string
	for _, key := range keys {
		if ocidist.ValidTag(key) && !slices.Contains(tags, key) {
			tags = append(tags, key)
		}
	}
	return tags
}

func (v servedImages) Open(sum osimage.SHA256) (*os.File, imagestore.Entry, error) {
	f, e, err := v.s.cfg.Store.Open(sum)
	if errors.Is(err, imagestore.ErrTampered) {
		// The store dropped (and logged) it: download it again.
		v.s.forgetStored(sum, "the stored file was tampered with and dropped; downloading it again")
	}
	return f, e, err
}

func (v servedImages) Readiness() (bool, string) { return v.s.ReplicaReady() }

func (v servedImages) Report() imagehttp.Report { return v.s.report() }

// report is the whole state, for the status page and the metrics.
func (s *Server) report() imagehttp.Report {
	statuses, selErr := s.Statuses()
	r := imagehttp.Report{
		Images: statuses, SelectError: selErr, Ready: s.Ready(), Phase: s.Phase(), Condition: s.Condition(),
		Inputs: s.InputsStatus(), Replicas: s.peerStatuses(), Leader: s.isLeader(), Scrub: s.ScrubStatus(),
		RefusedNeeds: s.RefusedNeeds(), LastCollection: s.LastCollection(), Used: s.cfg.Store.Used(),
	}
	r.Free, r.FreeErr = s.cfg.Store.Available()
	return r
}
