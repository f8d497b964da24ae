// Command registry is the OCI registry of the end-to-end cluster: the CNCF
// distribution registry (the one internal/devregistry runs in-process),
// run as a pod, plain HTTP, storing on disk. Besides the registry API it
// answers, under /e2e/:
//
//	GET /e2e/blobs   every blob request it served, by digest: who asked
//	                 (the client's address), the range, the bytes sent
//	PUT /e2e/rate    ?bytesPerSecond=N paces every blob response at N
//	                 bytes per second from now on (0: no pacing)
//
// so that a scenario counts what the registry sent from the registry's own
// side, and slows pulls down enough to stop one half way.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	"github.com/sirupsen/logrus"

	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

// Request is one blob request as the registry saw it.
type Request struct {
	Method string `json:"method"`
	// Remote is the client's IP address: a pod's, as no NAT sits between
	// pods on the node's bridge.
	Remote string `json:"remote"`
	Range  string `json:"range,omitempty"`
	// Start is the first byte asked for (0 without a range).
	Start  int64     `json:"start"`
	Status int       `json:"status"`
	Sent   int64     `json:"sent"`
	Began  time.Time `json:"began"`
	Ended  time.Time `json:"ended,omitzero"`
}

// Blob is what the registry sent of one blob.
type Blob struct {
	// Sent counts the body bytes of every GET, finished or not.
	Sent     int64      `json:"sent"`
	Requests []*Request `json:"requests"`
}

type stats struct {
	mu    sync.Mutex
	blobs map[string]*Blob
}

var blobPath = regexp.MustCompile(`^/v2/.+/blobs/(sha256:[a-f0-9]{64})$`)

// countingWriter counts and paces a blob response.
type countingWriter struct {
	http.ResponseWriter
	s     *stats
	req   *Request
	blob  *Blob
	rate  *atomic.Int64
	began time.Time
	// paced counts the bytes sent since the rate last changed, for pacing.
	paced     int64
	pacedFrom time.Time
	lastRate  int64
}

func (w *countingWriter) WriteHeader(code int) {
	w.s.mu.Lock()
	w.req.Status = code
	w.s.mu.Unlock()
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		chunk := p
		if len(chunk) > 32<<10 {
			chunk = chunk[:32<<10]
		}
		if rate := w.rate.Load(); rate > 0 {
			if rate != w.lastRate {
				w.lastRate, w.paced, w.pacedFrom = rate, 0, time.Now()
			}
			due := w.pacedFrom.Add(time.Duration(float64(w.paced) / float64(rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		n, err := w.ResponseWriter.Write(chunk)
		written += n
		w.paced += int64(n)
		w.s.mu.Lock()
		w.req.Sent += int64(n)
		w.blob.Sent += int64(n)
		w.s.mu.Unlock()
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *stats) middleware(rate *atomic.Int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := blobPath.FindStringSubmatch(r.URL.Path)
		if m == nil || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			next.ServeHTTP(w, r)
			return
		}
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		req := &Request{Method: r.Method, Remote: host, Range: r.Header.Get("Range"), Status: http.StatusOK, Began: time.Now()}
		var start, end int64
		if _, err := fmt.Sscanf(req.Range, "bytes=%d-%d", &start, &end); err == nil || start > 0 {
			req.Start = start
		}
		s.mu.Lock()
		b := s.blobs[m[1]]
		if b == nil {
			b = &Blob{}
			s.blobs[m[1]] = b
		}
		b.Requests = append(b.Requests, req)
		s.mu.Unlock()
		cw := &countingWriter{ResponseWriter: w, s: s, req: req, blob: b, rate: rate, began: req.Began}
		next.ServeHTTP(cw, r)
		s.mu.Lock()
		req.Ended = time.Now()
		line, _ := json.Marshal(struct {
			Blob string `json:"blob"`
			*Request
		}{m[1], req})
		s.mu.Unlock()
		fmt.Println(string(line))
	})
}

func (s *stats) serveBlobs(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	data, err := json.Marshal(s.blobs)
	s.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(data)
}

func main() {
	listen := flag.String("listen", ":5000", "address to serve on")
	root := flag.String("root", "/var/lib/registry", "directory the blobs are stored in")
	flag.Parse()
	logrus.SetOutput(io.Discard)

	cfg := &configuration.Configuration{}
	cfg.Log.AccessLog.Disabled = true
	cfg.HTTP.Secret = "osimages-e2e-registry"
	cfg.Storage = configuration.Storage{
		"filesystem":  configuration.Parameters{"rootdirectory": *root},
		"delete":      configuration.Parameters{"enabled": true},
		"maintenance": configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}},
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	s := &stats{blobs: map[string]*Blob{}}
	var rate atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /e2e/blobs", s.serveBlobs)
	mux.HandleFunc("PUT /e2e/rate", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("bytesPerSecond"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bytesPerSecond: want a number of bytes per second, 0 for no pacing", http.StatusBadRequest)
			return
		}
		rate.Store(n)
		log.Printf("blob responses paced at %d bytes/s", n)
	})
	mux.HandleFunc("GET /e2e/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.Handle("/", s.middleware(&rate, handlers.NewApp(ctx, cfg)))

	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	log.Printf("registry on %s, storing in %s", *listen, *root)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "registry:", err)
		os.Exit(1)
	}
}
