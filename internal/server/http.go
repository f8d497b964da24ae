package server

import (
	"errors"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/ocidist"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
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
	e := imagehttp.Endpoints{Images: servedImages{s}, Metrics: s.cfg.Metrics, SendTimeout: s.cfg.SendTimeout, Now: s.cfg.Now, Log: s.log, Hold: s.cfg.ClientHold}
	if s.view != nil {
		e.Peers = replica.Relay{
			View: s.view, Client: s.relayClient, SendTimeout: s.cfg.SendTimeout, Log: s.log,
			Hold: s.cfg.ClientHold, Rule: s.peerRule(), Failures: s.filler.Failures(),
			Size: s.declaredSize, Local: servedImages{s}.verified,
		}
	}
	reg := ocidist.Registry{Images: servedImages{s}, ServeBlob: e.ServeStored, RetryAfterSeconds: imagehttp.RetryAfterSeconds, Hold: e.HoldFor, Now: s.cfg.Now}
	if e.Peers != nil {
		reg.Peers = e.Peers
	}
	e.Registry = reg.Handler()
	return e
}

// servedImages implements imagehttp.Images.
type servedImages struct{ s *Server }

// servesLocked says whether the image URLs (and the OCI API) answer for
// img: selected, or deselected but kept because referenced (or because the
// references are not all known yet).
func (s *Server) servesLocked(sum osimage.SHA256, img *image) bool {
	return img.Selected || s.referencesUnknownLocked(img) || len(s.keptByLocked(sum, img)) > 0
}

func (v servedImages) Lookup(sum osimage.SHA256) (imagehttp.Image, bool) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok {
		return imagehttp.Image{}, false
	}
	// Before it is stored here, the md5 is the one the catalog declares,
	// which a peer that holds the image verified it against.
	md5 := img.entry.MD5
	if md5 == "" {
		md5 = img.Desc.MD5
	}
	out := imagehttp.Image{Served: s.servesLocked(sum, img), Stored: img.Stored, Phase: img.Phase, Filenames: img.ServedAs(), MD5: md5, VerifiedAt: img.entry.VerifiedAt}
	out.Failure, out.Refused, out.RetryAt = failureOf(img)
	return out, true
}

// failureOf is why the last download of img failed, whether its bytes
// were refused, and when the next one starts (zero when none will: a
// deselected image is not downloaded again), while img is failed.
func failureOf(img *image) (why string, refused bool, retryAt time.Time) {
	if img.Phase != PhaseFailed {
		return "", false, time.Time{}
	}
	if img.Selected {
		retryAt = img.NextTry
	}
	return img.Reason, img.refused, retryAt
}

// Image tells what is served of sum, for the OCI distribution face: the
// same as its image URLs serve, with a tag per key of a selected image.
func (v servedImages) Image(sum osimage.SHA256) (ocidist.Image, bool) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok || !s.servesLocked(sum, img) {
		return ocidist.Image{}, false
	}
	oi := ocidist.Image{SHA256: sum, Ready: img.Stored && img.Phase == PhaseReady, Size: img.entry.Size}
	oi.Failure, oi.Refused, oi.RetryAt = failureOf(img)
	if !oi.Ready {
		oi.Size = img.Desc.Size
	}
	if names := img.ServedAs(); len(names) > 0 {
		oi.Filename = names[0]
	}
	if img.Selected {
		oi.Tags = tagsOf(img.Wanted)
	}
	return oi, true
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

// verified opens the stored, verified file of sum; nil while there is
// none (replica.Relay.Local).
func (v servedImages) verified(sum osimage.SHA256) (*os.File, error) {
	s := v.s
	s.mu.Lock()
	img, ok := s.images[sum]
	held := ok && img.Stored && img.Phase == PhaseReady
	s.mu.Unlock()
	if !held {
		return nil, nil
	}
	f, _, err := v.Open(sum)
	return f, err
}

// declaredSize is the size the catalog declares for sum, 0 when none
// (replica.Relay.Size).
func (s *Server) declaredSize(sum osimage.SHA256) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if img, ok := s.images[sum]; ok {
		return img.Desc.Size
	}
	return 0
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
