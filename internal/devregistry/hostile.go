package devregistry

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
)

// Faults makes a registry hostile, one repository at a time. Give
// Faults.Middleware as Options.Middleware, then Set the behaviour the GETs
// of a repository's blobs or manifests meet; other requests reach the
// registry untouched. Behaviours can be set, changed and cleared while the
// registry runs. The zero value is ready to use and safe for concurrent use.
//
//	faults := &devregistry.Faults{}
//	reg := testenv.Registry(t, devregistry.Options{Middleware: faults.Middleware})
//	faults.Set("dib/slow", devregistry.Blobs, devregistry.Trickle(1, time.Second))
//
// The behaviours: Trickle, StallAfterHeaders, StallAfter (mid-body),
// Corrupt (bytes that do not match the digest), Longer (a body longer than
// the layer size the manifest announces). A lying manifest and a gzip bomb
// are published rather than served: see DiskImage.LayerSize, DiskImage.Layer
// and GzipBomb.
type Faults struct {
	mu    sync.Mutex
	rules map[faultKey]Fault
}

// Target is which GETs of a repository a Fault applies to.
type Target int

const (
	// Blobs are the GETs of the repository's blobs: the layer, the config,
	// signatures' layers.
	Blobs Target = iota
	// Manifests are the GETs of its manifests, by tag or digest.
	Manifests
)

// Fault answers a request in the registry's place; next is the registry,
// which it calls for the true response and alters as it goes.
type Fault func(w http.ResponseWriter, r *http.Request, next http.Handler)

type faultKey struct {
	repo   string
	target Target
}

// Set makes the GETs of target of repository repo (the path on the
// registry, such as "dib/ubuntu") meet fault; a nil fault clears it.
func (f *Faults) Set(repo string, target Target, fault Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rules == nil {
		f.rules = map[faultKey]Fault{}
	}
	if fault == nil {
		delete(f.rules, faultKey{repo, target})
		return
	}
	f.rules[faultKey{repo, target}] = fault
}

// Clear removes every behaviour of repo.
func (f *Faults) Clear(repo string) {
	f.Set(repo, Blobs, nil)
	f.Set(repo, Manifests, nil)
}

// Middleware applies the behaviours set; give it as Options.Middleware.
func (f *Faults) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			if repo, target, ok := parseAPIPath(r.URL.Path); ok {
				f.mu.Lock()
				fault := f.rules[faultKey{repo, target}]
				f.mu.Unlock()
				if fault != nil {
					fault(w, r, next)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// parseAPIPath splits /v2/<repo>/blobs/<digest> and
// /v2/<repo>/manifests/<reference>.
func parseAPIPath(p string) (string, Target, bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return "", 0, false
	}
	for _, t := range []struct {
		sep    string
		target Target
	}{{"/blobs/", Blobs}, {"/manifests/", Manifests}} {
		if i := strings.LastIndex(rest, t.sep); i > 0 {
			return rest[:i], t.target, true
		}
	}
	return "", 0, false
}

// Trickle sends the body n bytes at a time, one piece every interval: a
// source slow enough to hold a download slot for hours, never quite
// silent. The headers go at once.
func Trickle(n int, every time.Duration) Fault {
	return func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		next.ServeHTTP(&alterWriter{ResponseWriter: w, r: r, write: func(out *alterWriter, p []byte) (int, error) {
			sent := 0
			for len(p) > 0 {
				c := min(n, len(p))
				m, err := out.raw(p[:c])
				sent += m
				if err != nil {
					return sent, err
				}
				p = p[c:]
				if !out.pause(every) {
					return sent, r.Context().Err()
				}
			}
			return sent, nil
		}}, r)
	}
}

// StallAfterHeaders sends the status and headers (with the true
// Content-Length), then nothing until the client goes away or the registry
// closes.
func StallAfterHeaders() Fault { return StallAfter(0) }

// StallAfter sends the first n bytes of each body, then nothing until the
// client goes away or the registry closes: a transfer that stalls mid-blob.
func StallAfter(n int64) Fault {
	return func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		var off int64
		next.ServeHTTP(&alterWriter{ResponseWriter: w, r: r, write: func(out *alterWriter, p []byte) (int, error) {
			if off+int64(len(p)) <= n {
				off += int64(len(p))
				return out.raw(p)
			}
			m, err := out.raw(p[:n-off])
			off += int64(m)
			if err != nil {
				return m, err
			}
			<-r.Context().Done()
			return m, r.Context().Err()
		}}, r)
	}
}

// Corrupt flips the byte at offset at of each body (counted from the first
// byte of the response, so of the range for a range request): bytes that do
// not match the digest the manifest gives.
func Corrupt(at int64) Fault {
	return func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		var off int64
		next.ServeHTTP(&alterWriter{ResponseWriter: w, r: r, write: func(out *alterWriter, p []byte) (int, error) {
			if off <= at && at < off+int64(len(p)) {
				p = bytes.Clone(p)
				p[at-off] ^= 0x55
			}
			off += int64(len(p))
			return out.raw(p)
		}}, r)
	}
}

// Longer sends extra bytes after each body, without Content-Length (chunked
// encoding), as a registry whose blob does not have the size its manifest
// announces would.
func Longer(extra int64) Fault {
	return func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		out := &alterWriter{ResponseWriter: w, r: r, dropLength: true}
		next.ServeHTTP(out, r)
		if out.status/100 != 2 {
			return
		}
		pad := bytes.Repeat([]byte{0x5a}, 32<<10)
		for extra > 0 {
			n, err := out.Write(pad[:min(int64(len(pad)), extra)])
			if err != nil {
				return
			}
			extra -= int64(n)
		}
	}
}

// alterWriter passes the registry's response through write, flushing each
// piece, and never hands the body to an io.ReaderFrom (sendfile would
// bypass write).
type alterWriter struct {
	http.ResponseWriter
	r          *http.Request
	write      func(out *alterWriter, p []byte) (int, error)
	dropLength bool
	status     int
}

func (a *alterWriter) WriteHeader(code int) {
	if a.status != 0 {
		return
	}
	a.status = code
	if a.dropLength {
		a.Header().Del("Content-Length")
	}
	a.ResponseWriter.WriteHeader(code)
	// The client sees the headers now, whatever the body does next.
	_ = http.NewResponseController(a.ResponseWriter).Flush()
}

func (a *alterWriter) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	if a.write == nil || a.status/100 != 2 {
		return a.raw(p)
	}
	return a.write(a, p)
}

// raw writes p to the client and flushes it.
func (a *alterWriter) raw(p []byte) (int, error) {
	n, err := a.ResponseWriter.Write(p)
	if err == nil {
		err = http.NewResponseController(a.ResponseWriter).Flush()
	}
	return n, err
}

// pause waits d, false when the client went away meanwhile.
func (a *alterWriter) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-a.r.Context().Done():
		return false
	}
}

func (a *alterWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// GzipBomb returns a gzip stream of expanded bytes, about a thousandth of
// that size: a layer that decompresses to far more than it weighs. The
// bytes are 0x5a, not zeros, so that they take disk space where written
// (a store skips runs of zeros as holes). It is made of one compressed MiB
// repeated as gzip members, which every gzip reader reads as one stream,
// so that a large bomb is made at once.
func GzipBomb(expanded int64) []byte {
	member := func(n int64) []byte {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		_, _ = zw.Write(bytes.Repeat([]byte{0x5a}, int(n))) // a bytes.Buffer does not fail
		_ = zw.Close()
		return buf.Bytes()
	}
	const mib = 1 << 20
	out := bytes.Repeat(member(mib), int(expanded/mib))
	if rest := expanded % mib; rest > 0 || expanded == 0 {
		out = append(out, member(rest)...)
	}
	return out
}
