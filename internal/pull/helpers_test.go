package pull

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// fastPuller retries without the production waits.
func fastPuller(client *oci.Client) *Puller {
	return &Puller{OCI: client, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, IdleTimeout: 5 * time.Second}
}

func ociClient(t *testing.T, opts oci.Options) *oci.Client {
	t.Helper()
	// An empty Docker config: the tests never read the user's.
	if opts.RegistryConfig == "" {
		opts.RegistryConfig = filepath.Join(t.TempDir(), "config.json")
		os.WriteFile(opts.RegistryConfig, []byte("{}"), 0o600)
	}
	c, err := oci.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dockerConfig writes a Docker config.json with credentials for host.
func dockerConfig(t *testing.T, host, user, password string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	if err := os.WriteFile(path, []byte(`{"auths":{"`+host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// publish pushes content as an artifact of reg and returns the source that
// describes it.
func publish(t *testing.T, reg *devregistry.Registry, repo string, content []byte, gz bool, fields osimage.Image) (Source, devregistry.Published) {
	t.Helper()
	p, err := reg.Publish(context.Background(), devregistry.DiskImage{Repository: repo, Tag: "1.0", Content: content, Gzip: gz, Fields: fields})
	if err != nil {
		t.Fatal(err)
	}
	return sourceOf("oci://"+p.Ref, p.Fields), p
}

func sourceOf(uri string, f osimage.Image) Source {
	size, _ := strconv.ParseInt(f.Get(osimage.FieldSize), 10, 64)
	archive, _ := strconv.ParseInt(f.Get(osimage.FieldArchiveSize), 10, 64)
	return Source{URI: uri, SHA256: osimage.SHA256(f.Get(osimage.FieldSHA256)), MD5: f.Get(osimage.FieldMD5), Compression: f.Get(osimage.FieldCompression), Size: size, ArchiveSize: archive}
}

func openStore(t *testing.T) *imagestore.Store {
	t.Helper()
	s, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// memDest is an in-memory Destination that counts its resets.
type memDest struct {
	bytes.Buffer
	resets int
}

func (m *memDest) Reset() error {
	m.Buffer.Reset()
	m.resets++
	return nil
}

func shaHex(b []byte) osimage.SHA256 {
	s := sha256.Sum256(b)
	return osimage.SHA256(hex.EncodeToString(s[:]))
}

// assertStored checks that the store holds exactly content under sha256.
func assertStored(t *testing.T, s *imagestore.Store, content []byte) {
	t.Helper()
	f, e, err := s.Open(shaHex(content))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := f.WriteTo(h); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); osimage.SHA256(got) != e.SHA256 || e.Size != int64(len(content)) {
		t.Fatalf("stored file: sha256 %s, size %d; want %s, %d", got, e.Size, e.SHA256, len(content))
	}
}

func assertNothingStored(t *testing.T, s *imagestore.Store) {
	t.Helper()
	if l := s.List(); len(l) != 0 {
		t.Fatalf("a failed pull left entries: %+v", l)
	}
	if des, _ := os.ReadDir(filepath.Join(s.Dir(), "tmp")); len(des) != 0 {
		t.Fatalf("a failed pull left %d staging entries", len(des))
	}
}

// verifyError asserts that err is a *VerifyError about what, whose message
// names both values.
func verifyError(t *testing.T, err error, what string) *VerifyError {
	t.Helper()
	var v *VerifyError
	if !errors.As(err, &v) || v.What != what {
		t.Fatalf("error = %v, want a %s VerifyError", err, what)
	}
	if !strings.Contains(err.Error(), v.Expected) || !strings.Contains(err.Error(), v.Actual) || v.Expected == v.Actual {
		t.Fatalf("error %q does not name expected %q and actual %q", err, v.Expected, v.Actual)
	}
	return v
}

var closedRange = regexp.MustCompile(`^bytes=[0-9]+-[0-9]+$`)

// rangeGuard refuses open-ended and multiple ranges with 416, as some
// registries do, and records the Range headers it saw.
type rangeGuard struct {
	mu     sync.Mutex
	ranges []string
}

func (g *rangeGuard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rng := r.Header.Get("Range"); rng != "" {
			g.mu.Lock()
			g.ranges = append(g.ranges, rng)
			g.mu.Unlock()
			if !closedRange.MatchString(rng) {
				http.Error(w, "only closed ranges here", http.StatusRequestedRangeNotSatisfiable)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (g *rangeGuard) seen() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.ranges...)
}

// countingWriter counts the body bytes a handler writes.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (c countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// fileServer serves content at /img with http.ServeContent (ranges,
// Content-Length), behind a rangeGuard, counting the bytes sent.
func fileServer(t *testing.T, content []byte, tls bool) (*httptest.Server, *rangeGuard, *atomic.Int64) {
	t.Helper()
	g := &rangeGuard{}
	sent := &atomic.Int64{}
	h := g.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/img" {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(countingWriter{w, sent}, r, "img", time.Time{}, bytes.NewReader(content))
	}))
	srv := httptest.NewUnstartedServer(h)
	// The tests provoke TLS failures on purpose.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, g, sent
}

// caFile writes the CA of a TLS httptest server to a PEM file.
func caFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// newRegistry starts a registry on 127.0.0.1 that stores blobs on disk:
// distribution's in-memory driver takes seconds per MiB under the race
// detector.
func newRegistry(t *testing.T, opts devregistry.Options) *devregistry.Registry {
	t.Helper()
	opts.RootDirectory = t.TempDir()
	return testenv.Registry(t, opts)
}

// registryWith starts a registry whose handler is wrapped by mw.
func registryWith(t *testing.T, mw func(http.Handler) http.Handler) *devregistry.Registry {
	t.Helper()
	return newRegistry(t, devregistry.Options{Middleware: mw})
}

// isBlobGet tells a GET of the blob d.
func isBlobGet(r *http.Request, d string) bool {
	return r.Method == http.MethodGet && d != "" && strings.HasSuffix(r.URL.Path, "/blobs/"+d)
}

// newQuietServer serves h over a real socket on 127.0.0.1, without logging
// the aborted handlers tests provoke, and returns its URL.
func newQuietServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// PullInto pulls src into store under filename, and commits it once
// verified, as the image server does (internal/server): the tests drive
// Pull through it. An image already in the store is not downloaded again.
func (p *Puller) PullInto(ctx context.Context, store *imagestore.Store, filename string, src Source, progress Progress) (imagestore.Entry, Result, error) {
	if err := osimage.ValidateFilename(filename); err != nil {
		return imagestore.Entry{}, Result{}, fmt.Errorf("pulling %s: %w", display(src.URI), err)
	}
	if e, ok := store.Get(src.SHA256); ok {
		return e, Result{SHA256: string(e.SHA256), MD5: e.MD5, Size: e.Size}, nil
	}
	w, err := store.Create(src.SHA256)
	if err != nil {
		return imagestore.Entry{}, Result{}, fmt.Errorf("pulling %s: %w", display(src.URI), err)
	}
	defer w.Abort()
	res, err := p.Pull(ctx, src, w, progress)
	if err != nil {
		return imagestore.Entry{}, res, err
	}
	e := imagestore.Entry{SHA256: osimage.SHA256(res.SHA256), MD5: res.MD5, Filename: filename, Size: res.Size, VerifiedAt: time.Now()}
	if err := w.Commit(e); err != nil {
		return imagestore.Entry{}, res, fmt.Errorf("pulling %s: %w", display(src.URI), err)
	}
	e, _ = store.Get(osimage.SHA256(res.SHA256))
	return e, res, nil
}
