// Package imagehttp is the image server's HTTP face: the image URLs that
// Ironic and other clients download (/images/<sha256>/<filename>, with
// their .sha256sum and .md5sum files), health and readiness, the
// operators' status page and the Prometheus metrics. It reads the server
// through Images, a small interface: what is known of one sha256, its
// verified file, the readiness and a Report of the whole state.
package imagehttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sylva-projects/osimages/internal/httpsend"
	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
)

// Images is what the HTTP face asks of the image server.
type Images interface {
	// Lookup tells what is known of sum; ok is false when nothing is.
	Lookup(sum osimage.SHA256) (img Image, ok bool)
	// Open opens the stored, verified file of sum. An error wrapping
	// imagestore.ErrTampered says the store found it changed and dropped
	// it: the server no longer serves it and downloads it again.
	Open(sum osimage.SHA256) (*os.File, imagestore.Entry, error)
	// Readiness is the answer of /readyz: ready or, when not, why.
	Readiness() (bool, string)
	// Report is the whole state, for the status page and the metrics.
	Report() Report
}

// Image is what the HTTP face needs to answer for one sha256.
type Image struct {
	// Served: selected, or deselected but kept because referenced (or
	// because the references are not all known yet).
	Served, Stored bool
	Phase          imagelife.Phase
	Filenames      []string
	MD5            string
	VerifiedAt     time.Time
	// Failure is why the last download failed, while Phase is
	// PhaseFailed. Refused says that its bytes were refused: they did not
	// verify (the sha256, a digest, the size, the signature), so no byte
	// of them is served.
	Failure string
	Refused bool
	// RetryAt is when the next download of a failed image starts; zero
	// when none is scheduled.
	RetryAt time.Time
}

// Endpoints serve images through Images, with metrics when Metrics is
// not nil.
type Endpoints struct {
	Images  Images
	Metrics *Metrics
	// SendTimeout is how long one write of a response may block.
	SendTimeout time.Duration
	// Now is the clock of the status page (nil: time.Now).
	Now func() time.Time
	// Log gets what cannot be answered (nil: nothing is logged).
	Log *slog.Logger
	// Registry, when set, answers /v2/: the same images through the OCI
	// distribution API (package ocidist), on the same port and TLS.
	Registry http.Handler
	// Peers, when set, are the other replicas of the Service: a client's
	// request for a served image this server does not hold verified is
	// answered from a peer that does (replica.Relay).
	Peers Peers
	// Hold is how long a request for a served image that no replica
	// holds verified yet (it is queued or downloading) waits for one
	// before it is answered 503 with Retry-After; 0 answers at once. A
	// relay from a peer ends with it too, and a range or a conditional
	// request waits for the copy verified here (replica.Relayable).
	Hold time.Duration
}

// Peers is what the HTTP face asks of the other replicas.
type Peers interface {
	// Holds says whether a peer holds sum verified.
	Holds(sum osimage.SHA256) bool
	// Serve answers a GET or HEAD of the image sum, under name, with a
	// peer's verified copy; false, with nothing written, when no peer
	// could, the request may not be answered from a peer
	// (replica.Relayable: a range, a conditional request), or the image
	// got verified here. It ends by r's deadline at the latest.
	Serve(w http.ResponseWriter, r *http.Request, sum osimage.SHA256, name string) bool
}

// DefaultHold is what serve's --client-hold defaults to. Ironic's
// conductor checks an image URL with one HEAD and fails the host on
// anything but 200, without retrying; it and its agent read with a 60 s
// timeout (webserver_connection_timeout, image_download_connection_timeout):
// a request held 20 s is answered well inside it.
const DefaultHold = 20 * time.Second

// holdPoll is how often a held request looks again: a peer's copy is
// learnt from its state, read every replica.PollInterval.
const holdPoll = 100 * time.Millisecond

// RetryAfterSeconds is what a client is told to wait for an image that is
// selected but not ready yet.
const RetryAfterSeconds = 30

// Handler returns the handler of the images, their checksum files, the
// status page, health and metrics.
//
// Every image URL is /images/<sha256>/<filename>: the file is found by its
// sha256 in the server's own records and the store, never by joining the
// request path to a directory, so no request can reach a file outside the
// storage whatever it holds (.., encoded slashes, absolute paths, symlinks).
func (s Endpoints) Handler() http.Handler {
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /images/{sha256}/{file}", s.serveImage)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	// Readiness is about the server itself: while it waits for its catalog
	// it still serves what it has, its status page and its metrics, which
	// a not-ready pod would hide behind its Service. The phase says the rest
	// (status page, osimages_server_phase).
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		// A replica (Config.Replicas) joins the Service only once it
		// holds what its ready peers serve.
		if ok, why := s.Images.Readiness(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	if s.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.Metrics.registry, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /{$}", s.serveStatus)
	if s.Registry != nil {
		mux.Handle("/v2/", s.Registry)
	}
	var h http.Handler = mux
	if s.Metrics != nil {
		h = s.Metrics.instrument(h)
	}
	return httpsend.Deadline(s.SendTimeout, h)
}

// Server is an http.Server for Handler, with the timeouts a server
// facing many clients needs: a client gets 30 s to send its request
// headers, a keep-alive connection is closed after 2 minutes idle, and a
// response that cannot be written for SendTimeout is cut (see Handler).
func (s Endpoints) Server() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ConnContext:       httpsend.ConnContext,
	}
}

func (s Endpoints) serveImage(w http.ResponseWriter, r *http.Request) {
	// The one parser of image paths reads the path as sent, so that the
	// server answers exactly the URLs render writes (osimage.ImagePath).
	req, ok := osimage.ParseImagePath(r.URL.EscapedPath())
	if !ok {
		http.NotFound(w, r)
		return
	}
	sum, file := req.SHA256, req.Name()
	info, ok := s.Images.Lookup(sum)
	if !ok || !info.Served {
		http.NotFound(w, r)
		return
	}
	// Every filename the catalog gives the image is served, from the one
	// stored file.
	name, suffix, ok := servedFile(info.Filenames, file)
	if !ok {
		http.NotFound(w, r)
		return
	}
	var checksum string
	switch suffix {
	case ".sha256sum":
		checksum = string(sum)
	case ".md5sum":
		checksum = info.MD5
	}
	if !info.Stored || info.Phase != imagelife.PhaseReady {
		var ok bool
		if info, ok = s.hold(w, r, sum, name, suffix); !ok {
			return
		}
		if suffix == ".md5sum" {
			checksum = info.MD5
		}
	}
	if suffix != "" {
		if checksum == "" {
			http.NotFound(w, r) // an md5 the image never declared
			return
		}
		// The basename, as Ironic expects of a checksum file. Its own ETag
		// (not the image's) and the image's Last-Modified, so that caches
		// and conditional requests treat it as the image.
		body := checksum + "  " + name + "\n"
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("ETag", `"`+string(sum)+"-"+strings.TrimPrefix(path.Ext(file), ".")+`"`)
		http.ServeContent(w, r, file, info.VerifiedAt, strings.NewReader(body))
		return
	}
	s.ServeStored(w, r, sum)
}

// HoldFor holds r as a request of an image URL is held (servable): until
// sum is held verified here or by a peer, is no longer served, or Hold
// ends. The OCI distribution face (ocidist.Registry.Hold) holds its
// clients with it, so both faces hold alike.
func (s Endpoints) HoldFor(r *http.Request, sum osimage.SHA256) { s.servable(r, sum) }

// servable waits, up to Hold, until sum is held verified here (here) or
// by a peer (peer), or is no longer served. An image whose download
// failed is not waited for: its retry is minutes away.
func (s Endpoints) servable(r *http.Request, sum osimage.SHA256) (info Image, here, peer bool) {
	var deadline <-chan time.Time
	if s.Hold > 0 {
		t := time.NewTimer(s.Hold)
		defer t.Stop()
		deadline = t.C
	}
	tick := time.NewTicker(holdPoll)
	defer tick.Stop()
	for {
		var ok bool
		info, ok = s.Images.Lookup(sum)
		switch {
		case !ok || !info.Served:
			return Image{}, false, false
		case info.Stored && info.Phase == imagelife.PhaseReady:
			return info, true, false
		case s.Peers != nil && replica.Relayable(r) && s.Peers.Holds(sum):
			// A peer counts only for a request its copy may answer: a
			// range, or a conditional request, waits for the copy here.
			return info, false, true
		case deadline == nil || info.Phase == imagelife.PhaseFailed:
			return info, false, false
		}
		select {
		case <-r.Context().Done():
			return info, false, false
		case <-deadline:
			return info, false, false
		case <-tick.C:
		}
	}
}

// hold answers a request for an image not held verified here when it
// arrived: held up to Hold, it is relayed from a peer's verified copy
// when it may be (replica.Relayable), or answered 404 (deselected
// meanwhile) or 503 with Retry-After; ok says it was not, and is to be
// answered from here (the image got verified here, or the request is for
// a checksum file a peer's copy was verified against).
//
// A relay ends with the hold: a peer that stalls or trickles keeps no
// client longer than the image would have been held for. A relay that
// found no peer to answer, while the hold lasts, holds on: the image may
// be verified here, or another peer may hold it, before it ends.
func (s Endpoints) hold(w http.ResponseWriter, r *http.Request, sum osimage.SHA256, name, suffix string) (info Image, ok bool) {
	held := r
	if s.Hold > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), s.Hold)
		defer cancel()
		held = r.WithContext(ctx)
	}
	for {
		var here, peer bool
		info, here, peer = s.servable(held, sum)
		switch {
		case r.Context().Err() != nil:
			return info, false
		case !info.Served:
			http.NotFound(w, r) // deselected meanwhile
			return info, false
		case here:
			// Verified here while the request waited: served by the caller.
			return info, true
		case peer && suffix != "":
			// A checksum file says what the URL and the catalog say, which
			// a peer verified the bytes against: answered here.
			return info, true
		case peer && s.Peers.Serve(w, held, sum, name):
			return info, false
		case peer && s.Hold > 0 && held.Context().Err() == nil:
			// No peer could answer: hold on, a poll later.
			select {
			case <-held.Context().Done():
			case <-time.After(holdPoll):
			}
			continue
		}
		if info.Phase == imagelife.PhaseFailed {
			s.failed(w, sum, info)
			return info, false
		}
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		http.Error(w, fmt.Sprintf("image %s is selected but not ready yet (%s)", sum, info.Phase), http.StatusServiceUnavailable)
		return info, false
	}
}

// failed answers for an image whose last download failed, and that no
// peer could answer for. Bytes that did not verify are refused, not
// pending: 502, the source gave a bad answer, and waiting does not make
// them good. Another failure is 503. Retry-After only when a new download
// is scheduled, saying when; a client told to come back in 30 s would
// find the same answer for minutes.
func (s Endpoints) failed(w http.ResponseWriter, sum osimage.SHA256, info Image) {
	status, msg := http.StatusServiceUnavailable, fmt.Sprintf("image %s is not ready: its last download failed: %s", sum, info.Failure)
	if info.Refused {
		status, msg = http.StatusBadGateway, fmt.Sprintf("image %s is not served: what its source gave did not verify (%s), and what did not verify is never served", sum, info.Failure)
	}
	if wait, ok := RetryAfter(info.RetryAt, s.Now()); ok {
		w.Header().Set("Retry-After", strconv.Itoa(wait))
		msg += fmt.Sprintf("; a new download is scheduled in %d s", wait)
	} else {
		msg += "; no new download is scheduled: the image is no longer selected"
	}
	http.Error(w, msg, status)
}

// RetryAfter is the Retry-After of a failed image whose next download
// starts at retryAt: the seconds until then, at least 1; ok is false when
// none is scheduled (retryAt zero).
func RetryAfter(retryAt, now time.Time) (seconds int, ok bool) {
	if retryAt.IsZero() {
		return 0, false
	}
	return max(int(math.Ceil(retryAt.Sub(now).Seconds())), 1), true
}

// ServeStored sends the stored, verified file of sum (to a client, or to
// a peer replica).
func (s Endpoints) ServeStored(w http.ResponseWriter, r *http.Request, sum osimage.SHA256) {
	f, entry, err := s.Images.Open(sum)
	if errors.Is(err, imagestore.ErrTampered) {
		// The store dropped (and logged) it; the server downloads it again.
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		http.Error(w, fmt.Sprintf("image %s is being downloaded again", sum), http.StatusServiceUnavailable)
		return
	}
	if err != nil {
		s.Log.Error("opening a stored image failed", "sha256", sum, "error", err)
		http.Error(w, "image unavailable", http.StatusInternalServerError)
		return
	}
	defer f.Close()
	w.Header().Set("ETag", `"`+string(sum)+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	if rng, ok := withoutEmptySuffixes(r.Header.Get("Range")); !ok {
		// Go's ServeContent answers bytes=-0 with a 206 whose
		// Content-Range is invalid; a suffix of 0 bytes is unsatisfiable.
		w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(entry.Size, 10))
		http.Error(w, "requested range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
		return
	} else if rng != r.Header.Get("Range") {
		r.Header.Set("Range", rng)
	}
	// http.ServeContent answers HEAD exactly as GET (with Content-Length),
	// Range and conditional requests, and sends an *os.File with sendfile.
	defer httpsend.Corked(r)()
	http.ServeContent(&httpsend.Writer{ResponseWriter: w, Timeout: s.SendTimeout}, r, entry.Filename, entry.VerifiedAt, f)
}

// withoutEmptySuffixes removes the suffix ranges of length 0 ("-0") from a
// Range header of bytes; ok is false when nothing else was asked. Other
// headers are returned as they are, for ServeContent to judge.
func withoutEmptySuffixes(h string) (string, bool) {
	specs, found := strings.CutPrefix(h, "bytes=")
	if !found {
		return h, true
	}
	var kept []string
	for _, spec := range strings.Split(specs, ",") {
		spec = strings.TrimSpace(spec)
		if suffix, ok := strings.CutPrefix(spec, "-"); ok {
			if n, err := strconv.ParseInt(suffix, 10, 64); err == nil && n == 0 {
				continue
			}
		}
		kept = append(kept, spec)
	}
	if len(kept) == 0 {
		return "", false
	}
	return "bytes=" + strings.Join(kept, ","), true
}

// isImagePath says whether a request path (as sent, escaped) is an image
// download, for the byte counter.
func isImagePath(escaped string) bool {
	f, ok := osimage.ParseImagePath(escaped)
	return ok && f.Checksum == ""
}

// servedFile tells which file of an image a request names: one of its
// filenames, or the .sha256sum or .md5sum of one (suffix). The filename
// itself wins over a checksum reading of it.
func servedFile(names []string, file string) (name, suffix string, ok bool) {
	if slices.Contains(names, file) {
		return file, "", true
	}
	for _, suffix := range []string{".sha256sum", ".md5sum"} {
		if name, cut := strings.CutSuffix(file, suffix); cut && slices.Contains(names, name) {
			return name, suffix, true
		}
	}
	return "", "", false
}
