package server

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/httpsend"
	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/serverio"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// fakeSource stands for the registries: the byte path itself (pull) is
// tested against a real registry in its own package and end to end; here the
// server's decisions are under test, over real sockets.
type fakeSource struct {
	mu      sync.Mutex
	content map[osimage.SHA256][]byte
	gates   map[osimage.SHA256]chan struct{} // closed when the pull may finish
	fail    map[osimage.SHA256]error
	// failURI fails the pulls of a record by its uri.
	failURI map[string]error
	pulls   atomic.Int32
}

func newFakeSource() *fakeSource {
	return &fakeSource{content: map[osimage.SHA256][]byte{}, gates: map[osimage.SHA256]chan struct{}{}, fail: map[osimage.SHA256]error{}, failURI: map[string]error{}}
}

// add registers an image and returns its servedset.Wanted record.
func (f *fakeSource) add(key string, content []byte, gated bool) servedset.Wanted {
	s := sha256.Sum256(content)
	m := md5.Sum(content)
	sum := osimage.SHA256(hex.EncodeToString(s[:]))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.content[sum] = content
	if gated {
		f.gates[sum] = make(chan struct{})
	}
	img := osimage.Image{
		"sha256": sum.String(), "md5": hex.EncodeToString(m[:]), "filename": key + ".raw",
		"size": fmt.Sprint(len(content)), "archive-size": fmt.Sprint(len(content)), "uri": "oci://example/" + key + ":1",
	}
	return servedset.Wanted{SHA256: sum, Key: key, SelectedBy: []string{"test"}, Desc: img.Descriptor()}
}

func (f *fakeSource) release(sum osimage.SHA256) { close(f.gates[sum]) }

func (f *fakeSource) pull(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress func(int64, int64)) (pull.Result, error) {
	f.pulls.Add(1)
	f.mu.Lock()
	content, gate, failure := f.content[w.SHA256], f.gates[w.SHA256], f.fail[w.SHA256]
	if err := f.failURI[w.Desc.URI]; err != nil {
		failure = err
	}
	f.mu.Unlock()
	if failure != nil {
		return pull.Result{}, failure
	}
	half := len(content) / 2
	if _, err := dst.Write(content[:half]); err != nil {
		return pull.Result{}, err
	}
	progress(int64(half), int64(len(content)))
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return pull.Result{}, ctx.Err()
		}
	}
	if _, err := dst.Write(content[half:]); err != nil {
		return pull.Result{}, err
	}
	progress(int64(len(content)), int64(len(content)))
	return pull.Result{SHA256: w.SHA256.String(), MD5: w.Desc.MD5, Size: int64(len(content))}, nil
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type harness struct {
	t      *testing.T
	srv    *Server
	src    *fakeSource
	store  *imagestore.Store
	http   *httptest.Server
	output string
	clock  *clock
	cancel context.CancelFunc
	done   chan struct{}
}

func start(t *testing.T, dir string, src *fakeSource, tweak func(*Config)) *harness {
	t.Helper()
	store, err := imagestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, src: src, store: store, output: filepath.Join(t.TempDir(), "served.yaml"),
		clock: &clock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}, done: make(chan struct{})}
	cfg := Config{Store: store, Pull: src.pull, Publisher: serverio.FilePublisher{Path: h.output}, Concurrency: 2,
		GCGrace: time.Hour, FreeSpaceMargin: 1, RetryBase: 50 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		Metrics: imagehttp.NewMetrics(), Now: h.clock.Now}
	if tweak != nil {
		tweak(&cfg)
	}
	h.srv = New(cfg)
	h.http = httptest.NewUnstartedServer(h.srv.Handler())
	h.http.Config.ConnContext = httpsend.ConnContext
	h.http.Start()
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.srv.Run(ctx); close(h.done) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	<-h.done
	h.http.Close()
	h.store.Close()
	h.cancel = nil
}

func (h *harness) want(ws ...servedset.Wanted) {
	m := map[osimage.SHA256]servedset.Wanted{}
	for _, w := range ws {
		m[w.SHA256] = w
	}
	h.srv.SetDesired(m, nil)
}

func (h *harness) get(path string, header ...string) (*http.Response, []byte) {
	h.t.Helper()
	return h.do(http.MethodGet, path, header...)
}

func (h *harness) do(method, path string, header ...string) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.http.URL+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp, body
}

// waitPhase waits until the image reaches phase.
func (h *harness) waitPhase(sum osimage.SHA256, phase Phase) {
	h.t.Helper()
	testenv.Poll(h.t, fmt.Sprintf("image %s reaching %s", sum[:12], phase), 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		statuses, _ := h.srv.Statuses()
		for _, st := range statuses {
			if st.SHA256 == sum && st.Phase == phase {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", statuses)
	})
}

// waitOutput waits until the published document satisfies cond.
func (h *harness) waitOutput(what string, cond func(osimage.ServedSet) bool) osimage.ServedSet {
	h.t.Helper()
	var last osimage.ServedSet
	testenv.Poll(h.t, "output "+what, 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		data, err := os.ReadFile(h.output)
		if err != nil {
			return false, err.Error()
		}
		if last, err = osimage.ParseServed(data); err != nil {
			return false, err.Error()
		}
		return cond(last), fmt.Sprint(last)
	})
	return last
}

func (h *harness) waitPublished(sum osimage.SHA256, available bool) osimage.ServedSet {
	h.t.Helper()
	return h.waitOutput(fmt.Sprintf("had %s available=%v", sum[:12], available), func(s osimage.ServedSet) bool {
		e, ok := s[sum]
		return ok && e.Available == available
	})
}

func (h *harness) waitUnpublished(sum osimage.SHA256) {
	h.t.Helper()
	h.waitOutput("dropped "+sum.String()[:12], func(s osimage.ServedSet) bool { _, ok := s[sum]; return !ok })
}

func imageURL(w servedset.Wanted) string {
	return "/images/" + w.SHA256.String() + "/" + w.Desc.Filename
}

func TestServeLifecycle(t *testing.T) {
	src := newFakeSource()
	content := []byte(strings.Repeat("0123456789abcdef", 4096))
	a := src.add("ubuntu-a", content, true)
	h := start(t, t.TempDir(), src, nil)
	h.want(a)

	h.waitPhase(a.SHA256, PhaseDownloading)
	resp, _ := h.get(imageURL(a))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("selected but not ready: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if served := h.waitPublished(a.SHA256, false); served[a.SHA256].ImageKey != "ubuntu-a" {
		t.Errorf("published while downloading: %v", served)
	}
	testenv.Poll(t, "the status page showing the download half way", 5*time.Second, 5*time.Millisecond, func() (bool, string) {
		_, page := h.get("/")
		return strings.Contains(string(page), "downloading</span> 50%"), string(page)
	})

	src.release(a.SHA256)
	h.waitPhase(a.SHA256, PhaseReady)
	h.waitPublished(a.SHA256, true)

	resp, body := h.get(imageURL(a))
	if resp.StatusCode != 200 || string(body) != string(content) {
		t.Fatalf("GET: %d, %d bytes", resp.StatusCode, len(body))
	}
	if resp.Header.Get("ETag") != `"`+a.SHA256.String()+`"` || resp.Header.Get("Last-Modified") == "" {
		t.Errorf("headers: %v", resp.Header)
	}
	head, headBody := h.do(http.MethodHead, imageURL(a))
	if head.StatusCode != 200 || head.Header.Get("Content-Length") != fmt.Sprint(len(content)) || len(headBody) != 0 {
		t.Errorf("HEAD must answer as GET does: %d, length %q", head.StatusCode, head.Header.Get("Content-Length"))
	}
	resp, body = h.get(imageURL(a), "Range", "bytes=100-199")
	if resp.StatusCode != http.StatusPartialContent || string(body) != string(content[100:200]) ||
		resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 100-199/%d", len(content)) {
		t.Errorf("Range: %d %q", resp.StatusCode, resp.Header.Get("Content-Range"))
	}
	if resp, _ := h.get(imageURL(a), "If-None-Match", `"`+a.SHA256.String()+`"`); resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match: %d", resp.StatusCode)
	}
	if resp, _ := h.get(imageURL(a), "If-Modified-Since", h.clock.Now().Add(time.Hour).UTC().Format(http.TimeFormat)); resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-Modified-Since: %d", resp.StatusCode)
	}
	if resp, body := h.get(imageURL(a), "Range", "bytes=0-9", "If-Range", `"other"`); resp.StatusCode != 200 || len(body) != len(content) {
		t.Errorf("If-Range with another ETag must send the whole file: %d", resp.StatusCode)
	}
	if _, body := h.get(imageURL(a) + ".sha256sum"); string(body) != a.SHA256.String()+"  ubuntu-a.raw\n" {
		t.Errorf(".sha256sum: %q", body)
	}
	if _, body := h.get(imageURL(a) + ".md5sum"); string(body) != a.Desc.MD5+"  ubuntu-a.raw\n" {
		t.Errorf(".md5sum: %q", body)
	}
	if resp, _ := h.get("/images/" + a.SHA256.String() + "/other-name.raw"); resp.StatusCode != 404 {
		t.Errorf("another file name under a served sha256: %d", resp.StatusCode)
	}
	if resp, _ := h.get("/images/" + strings.Repeat("0", 64) + "/x.raw"); resp.StatusCode != 404 {
		t.Errorf("not selected: %d", resp.StatusCode)
	}
	if resp, _ := h.get("/images/"); resp.StatusCode != 404 {
		t.Errorf("directory listing: %d", resp.StatusCode)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, _ := h.get(p); resp.StatusCode != 200 {
			t.Errorf("%s: %d", p, resp.StatusCode)
		}
	}
	_, metrics := h.get("/metrics")
	for _, m := range []string{"osimages_http_requests_total{code=\"200\"}", "osimages_http_served_bytes_total", "osimages_images{phase=\"ready\",selected=\"true\"} 1",
		"osimages_downloads_in_flight 0", "osimages_downloaded_bytes_total", "osimages_verification_failures_total 0", "osimages_disk_free_bytes"} {
		if !strings.Contains(string(metrics), m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

func TestTraversalIsNeverServed(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("image bytes"), false)
	dir := t.TempDir()
	h := start(t, dir, src, nil)
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("TOP-SECRET-CONTENT"), 0o600)
	// A symlink planted next to the stored image is not a served name.
	imgDir := filepath.Join(dir, "images", a.SHA256.String())
	if err := os.Symlink(secret, filepath.Join(imgDir, "link.raw")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		"/images/" + a.SHA256.String() + "/../../../../etc/passwd",
		"/images/" + a.SHA256.String() + "/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
		"/images/" + a.SHA256.String() + "/..%2f..%2f" + a.SHA256.String() + "%2f" + a.Desc.Filename,
		"/images/..%2f..%2fetc/passwd",
		"/images/" + a.SHA256.String() + "/link.raw",
		"/images/" + a.SHA256.String() + "/" + secret,
		"/images/" + a.SHA256.String() + "/%2F" + strings.TrimPrefix(secret, "/"),
		"//etc/passwd",
		"/images/" + a.SHA256.String(),
		"/images/" + a.SHA256.String() + "/",
		"/images/" + strings.ToUpper(a.SHA256.String()) + "/" + a.Desc.Filename,
		"/images/" + a.SHA256.String() + "/" + a.Desc.Filename + "/",
		"/images/" + a.SHA256.String() + "/" + a.Desc.Filename + "%00",
	} {
		req, _ := http.NewRequest(http.MethodGet, h.http.URL, nil)
		req.URL.Opaque = p // sent as written, unnormalised by the client
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 || strings.Contains(string(body), "TOP-SECRET-CONTENT") || strings.Contains(string(body), "root:") || strings.Contains(string(body), "image bytes") {
			t.Errorf("%s: %d %q", p, resp.StatusCode, body)
		}
	}
}

func TestDeselectKeepsThenCollects(t *testing.T) {
	src := newFakeSource()
	big := []byte(strings.Repeat("x", 8<<20))
	a := src.add("ubuntu-a", big, false)
	b := src.add("ubuntu-b", []byte("b bytes"), false)
	h := start(t, t.TempDir(), src, nil)
	h.want(a, b)
	h.waitPhase(a.SHA256, PhaseReady)
	h.waitPhase(b.SHA256, PhaseReady)

	// A client is downloading a when it is deselected and collected.
	resp, err := http.Get(h.http.URL + imageURL(a))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, 1<<20)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}

	h.want(b)
	if resp, _ := h.get(imageURL(a)); resp.StatusCode != 404 {
		t.Errorf("deselected image still served to new requests: %d", resp.StatusCode)
	}
	h.waitUnpublished(a.SHA256)
	h.srv.CollectGarbage()
	if _, ok := h.store.Get(a.SHA256); !ok {
		t.Fatal("collected before the grace period")
	}
	h.clock.advance(time.Hour)
	h.srv.CollectGarbage()
	if _, ok := h.store.Get(a.SHA256); ok {
		t.Fatal("not collected after the grace period")
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || len(first)+len(rest) != len(big) {
		t.Fatalf("the client's download was cut by garbage collection: %d bytes, %v", len(first)+len(rest), err)
	}

	// Selected again: downloaded again.
	before := src.pulls.Load()
	h.want(a, b)
	h.waitPhase(a.SHA256, PhaseReady)
	if src.pulls.Load() == before {
		t.Error("a collected image selected again was not downloaded")
	}
}

func TestRestartServesStoredImages(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("a bytes"), false)
	dir := t.TempDir()
	h := start(t, dir, src, nil)
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	h.stop()

	pulls := src.pulls.Load()
	h2 := start(t, dir, src, nil)
	h2.want(a)
	if resp, body := h2.get(imageURL(a)); resp.StatusCode != 200 || string(body) != "a bytes" {
		t.Fatalf("after a restart: %d %q", resp.StatusCode, body)
	}
	h2.waitPublished(a.SHA256, true)
	if src.pulls.Load() != pulls {
		t.Error("a stored image was downloaded again after a restart")
	}
}

func TestFailureIsolationAndRetry(t *testing.T) {
	src := newFakeSource()
	bad := src.add("bad-image", []byte("bad"), false)
	good := src.add("good-image", []byte("good"), false)
	src.fail[bad.SHA256] = fmt.Errorf("pulling: %w", &pull.VerifyError{What: "sha256", Expected: "00ff", Actual: "1234"})
	h := start(t, t.TempDir(), src, nil)
	h.want(bad, good)
	h.waitPhase(good.SHA256, PhaseReady)
	h.waitPhase(bad.SHA256, PhaseFailed)
	// Refused, not pending: 502 on both faces, saying why, and
	// Retry-After when the next download is due (50 ms on the frozen
	// clock: 1 s), not a made-up 30 s.
	manifest := "/v2/images/" + bad.SHA256.String() + "/manifests/raw"
	for _, path := range []string{imageURL(bad), imageURL(bad) + ".sha256sum", manifest} {
		resp, body := h.get(path)
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("GET %s of an image whose bytes did not verify: %s, Retry-After %q; want 502, 1\n%s", path, resp.Status, resp.Header.Get("Retry-After"), body)
		}
		for _, want := range []string{"is not served: what its source gave did not verify (pulling: sha256 mismatch: expected 00ff, got 1234", "a new download is scheduled in 1 s"} {
			if !strings.Contains(string(body), want) {
				t.Errorf("GET %s: body lacks %q:\n%s", path, want, body)
			}
		}
		if strings.Contains(string(body), "not ready yet") {
			t.Errorf("GET %s: a refusal answered as pending:\n%s", path, body)
		}
	}
	if served := h.waitPublished(good.SHA256, true); served[bad.SHA256].Available {
		t.Error("a failed image is published as available")
	}
	_, page := h.get("/")
	if !strings.Contains(string(page), "00ff") || !strings.Contains(string(page), "1234") {
		t.Errorf("status page lacks the reason:\n%s", page)
	}
	_, metrics := h.get("/metrics")
	if strings.Contains(string(metrics), "osimages_verification_failures_total 0") {
		t.Error("verification failure not counted")
	}
	// Retried with backoff, and served once the source is fixed.
	src.mu.Lock()
	delete(src.fail, bad.SHA256)
	src.mu.Unlock()
	h.clock.advance(time.Minute)
	h.waitPhase(bad.SHA256, PhaseReady)
}

func TestStorageLimits(t *testing.T) {
	src := newFakeSource()
	small := src.add("small", []byte("small"), false)
	huge := src.add("huge", []byte("huge"), false)
	huge.Desc.Size = 1 << 50
	h := start(t, t.TempDir(), src, func(c *Config) { c.MaxImageSize = 1 << 60 })
	h.want(small, huge)
	h.waitPhase(huge.SHA256, PhaseFailed)
	h.waitPhase(small.SHA256, PhaseReady)
	statuses, _ := h.srv.Statuses()
	for _, st := range statuses {
		if st.SHA256 == huge.SHA256 && !strings.Contains(st.Reason, "not enough free disk space") {
			t.Errorf("reason: %q", st.Reason)
		}
	}

	h2 := start(t, t.TempDir(), src, func(c *Config) { c.MaxStorage = 16 })
	other := src.add("other", []byte(strings.Repeat("o", 32)), false)
	h2.want(small, other)
	h2.waitPhase(other.SHA256, PhaseFailed)
	h2.waitPhase(small.SHA256, PhaseReady)
	statuses, _ = h2.srv.Statuses()
	for _, st := range statuses {
		if st.SHA256 == other.SHA256 && !strings.Contains(st.Reason, "--max-storage") {
			t.Errorf("reason: %q", st.Reason)
		}
	}
}

func TestDeselectCancelsDownload(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("a bytes, long enough"), true)
	h := start(t, t.TempDir(), src, nil)
	h.want(a)
	h.waitPhase(a.SHA256, PhaseDownloading)
	h.want()
	testenv.Poll(t, "the deselected download forgotten", 5*time.Second, 5*time.Millisecond, func() (bool, string) {
		st, _ := h.srv.Statuses()
		return len(st) == 0, fmt.Sprintf("still known: %+v", st)
	})
	if _, ok := h.store.Get(a.SHA256); ok || len(h.store.List()) != 0 {
		t.Error("a cancelled download left a stored image")
	}
}

// staticRefs is a References for the state-machine test; the real one
// (Metal3 informers) is tested against an apiserver in cmd/osimages.
type staticRefs struct {
	mu     sync.Mutex
	synced bool
	refs   map[osimage.SHA256][]string
}

func (r *staticRefs) Synced() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.synced }
func (r *staticRefs) ReferencedBy(sum osimage.SHA256) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refs[sum]
}
func (r *staticRefs) set(synced bool, refs map[osimage.SHA256][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced, r.refs = synced, refs
}

func TestReferencedImagesAreKeptAndServed(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("a bytes"), false)
	b := src.add("ubuntu-b", []byte("b bytes"), false)
	refs := &staticRefs{}
	h := start(t, t.TempDir(), src, func(c *Config) { c.References = refs })
	h.want(a, b)
	h.waitPhase(a.SHA256, PhaseReady)
	h.waitPhase(b.SHA256, PhaseReady)

	h.want(b)
	h.waitUnpublished(a.SHA256)
	h.clock.advance(2 * time.Hour)
	// References not known yet: nothing may go, and a host that boots
	// from a template not listed yet still gets its image.
	h.srv.CollectGarbage()
	if _, ok := h.store.Get(a.SHA256); !ok {
		t.Fatal("collected while the references were not known")
	}
	if at := h.srv.LastCollection(); !at.IsZero() {
		t.Errorf("a postponed pass counts as a collection at %v", at)
	}
	if resp, body := h.get(imageURL(a)); resp.StatusCode != 200 || string(body) != "a bytes" {
		t.Errorf("a deselected image must stay served while the references are not known: %d %q", resp.StatusCode, body)
	}
	if _, page := h.get("/"); !strings.Contains(string(page), "kept and served until the Metal3 objects that may reference it are all known") {
		t.Errorf("status page does not say why the image is kept:\n%s", page)
	}
	refs.set(true, map[osimage.SHA256][]string{a.SHA256: {"Metal3MachineTemplate wc1/wc1-md0-abc"}})
	h.srv.CollectGarbage()
	if _, ok := h.store.Get(a.SHA256); !ok {
		t.Fatal("a referenced image was collected")
	}
	if at := h.srv.LastCollection(); !at.Equal(h.clock.Now()) {
		t.Errorf("last collection at %v, want %v", at, h.clock.Now())
	}
	// Deselected but referenced: still served, still not published.
	if resp, body := h.get(imageURL(a)); resp.StatusCode != 200 || string(body) != "a bytes" {
		t.Errorf("a referenced image must stay served: %d %q", resp.StatusCode, body)
	}
	if resp, body := h.get(imageURL(a) + ".sha256sum"); resp.StatusCode != 200 || !strings.HasPrefix(string(body), a.SHA256.String()) {
		t.Errorf("its checksum too: %d %q", resp.StatusCode, body)
	}
	resp, page := h.get("/")
	if resp.StatusCode != 200 || !strings.Contains(string(page), "kept: still referenced by Metal3MachineTemplate wc1/wc1-md0-abc") {
		t.Errorf("status page does not say why the image is kept:\n%s", page)
	}
	_, metrics := h.get("/metrics")
	if !strings.Contains(string(metrics), `osimages_images_kept_referenced{key="ubuntu-a",referenced_by="Metal3MachineTemplate wc1/wc1-md0-abc",sha256="`+a.SHA256.String()+`"} 1`) {
		t.Errorf("metric missing:\n%s", grepLines(string(metrics), "kept"))
	}

	// The last reference goes: collected at the next pass, and 404.
	refs.set(true, nil)
	if resp, _ := h.get(imageURL(a)); resp.StatusCode != 404 {
		t.Errorf("an unreferenced deselected image is served: %d", resp.StatusCode)
	}
	h.srv.CollectGarbage()
	if _, ok := h.store.Get(a.SHA256); ok {
		t.Fatal("not collected once unreferenced")
	}
	if _, ok := h.store.Get(b.SHA256); !ok {
		t.Fatal("the selected image was collected")
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
