package server

import (
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// RetryAfterSeconds is what a client is told to wait for an image that is
// selected but not ready yet.
const RetryAfterSeconds = 30

// Handler serves the images, their checksum files, the status page, health
// and metrics.
//
// Every image URL is /images/<sha256>/<filename>: the file is found by its
// sha256 in the server's own records and the store, never by joining the
// request path to a directory, so no request can reach a file outside the
// storage whatever it holds (.., encoded slashes, absolute paths, symlinks).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /images/{sha256}/{file}", s.serveImage)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "not ready: the images to serve are not known yet", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Metrics.registry, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /{$}", s.serveStatus)
	var h http.Handler = mux
	if s.cfg.Metrics != nil {
		h = s.cfg.Metrics.instrument(h)
	}
	return h
}

func (s *Server) serveImage(w http.ResponseWriter, r *http.Request) {
	// The one parser of image paths reads the path as sent, so that the
	// server answers exactly the URLs render writes (osimage.ImagePath).
	req, ok := osimage.ParseImagePath(r.URL.EscapedPath())
	if !ok {
		http.NotFound(w, r)
		return
	}
	sum, file := string(req.SHA256), req.Name()
	info, ok := s.lookup(sum)
	if !ok || !info.served {
		http.NotFound(w, r)
		return
	}
	var checksum string
	switch file {
	case info.filename:
	case info.filename + ".sha256sum":
		checksum = sum
	case info.filename + ".md5sum":
		checksum = info.md5
	default:
		http.NotFound(w, r)
		return
	}
	if !info.stored || info.phase != PhaseReady {
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		http.Error(w, fmt.Sprintf("image %s is selected but not ready yet (%s)", sum, info.phase), http.StatusServiceUnavailable)
		return
	}
	if file != info.filename {
		if checksum == "" {
			http.NotFound(w, r) // an md5 the image never declared
			return
		}
		// The basename, as Ironic expects of a checksum file.
		body := checksum + "  " + info.filename + "\n"
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if r.Method != http.MethodHead {
			io.WriteString(w, body)
		}
		return
	}

	f, entry, err := s.cfg.Store.Open(sum)
	if err != nil {
		s.log.Error("opening a stored image failed", "sha256", sum, "error", err)
		http.Error(w, "image unavailable", http.StatusInternalServerError)
		return
	}
	defer f.Close()
	w.Header().Set("ETag", `"`+sum+`"`)
	w.Header().Set("Content-Type", "application/octet-stream")
	// http.ServeContent answers HEAD exactly as GET (with Content-Length),
	// Range and conditional requests, and sends an *os.File with sendfile.
	defer corked(r)()
	http.ServeContent(piecewise{w}, r, entry.Filename, entry.VerifiedAt, f)
}

// isImagePath says whether a request path (as sent, escaped) is an image
// download, for the byte counter.
func isImagePath(escaped string) bool {
	f, ok := osimage.ParseImagePath(escaped)
	return ok && f.Checksum == ""
}
