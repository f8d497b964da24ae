package imagehttp

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// fakeImages is the server's state as a table: the HTTP face is tested
// over real sockets (httptest) against real files; the server's own tests
// serve what it downloads.
type fakeImages struct {
	dir      string
	mu       sync.Mutex
	images   map[osimage.SHA256]Image
	tampered map[osimage.SHA256]bool
	dropped  []osimage.SHA256
	ready    bool
}

func (f *fakeImages) Lookup(sum osimage.SHA256) (Image, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	img, ok := f.images[sum]
	return img, ok
}

func (f *fakeImages) Open(sum osimage.SHA256) (*os.File, imagestore.Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tampered[sum] {
		f.dropped = append(f.dropped, sum)
		return nil, imagestore.Entry{}, fmt.Errorf("image %s: %w", sum, imagestore.ErrTampered)
	}
	img := f.images[sum]
	file, err := os.Open(filepath.Join(f.dir, string(sum)))
	if err != nil {
		return nil, imagestore.Entry{}, err
	}
	info, err := file.Stat()
	return file, imagestore.Entry{SHA256: sum, Filename: img.Filenames[0], Size: info.Size(), VerifiedAt: img.VerifiedAt}, err
}

func (f *fakeImages) Readiness() (bool, string) {
	if f.ready {
		return true, ""
	}
	return false, "filling 1 image that peers serve"
}

func (f *fakeImages) Report() Report {
	return Report{Ready: true, Phase: ServerServing, Images: []Status{{SHA256: sha('a'), Key: "a", Phase: imagelife.PhaseReady, Selected: true, Filenames: []string{"a.raw"}}}}
}

func sha(c byte) osimage.SHA256 { return osimage.SHA256(strings.Repeat(string(c), 64)) }

func serve(t *testing.T, images *fakeImages, m *Metrics) *httptest.Server {
	t.Helper()
	h := Endpoints{Images: images, Metrics: m, SendTimeout: time.Minute, Now: time.Now, Log: slog.New(slog.DiscardHandler)}
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func newImages(t *testing.T, content string) (*fakeImages, osimage.SHA256) {
	dir := t.TempDir()
	h := sha256.Sum256([]byte(content))
	sum := osimage.SHA256(hex.EncodeToString(h[:]))
	if err := os.WriteFile(filepath.Join(dir, string(sum)), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return &fakeImages{dir: dir, ready: true, tampered: map[osimage.SHA256]bool{}, images: map[osimage.SHA256]Image{
		sum: {Served: true, Stored: true, Phase: imagelife.PhaseReady, Filenames: []string{"good.raw", "renamed.raw"}, MD5: "0123456789abcdef0123456789abcdef", VerifiedAt: time.Unix(1e9, 0)},
	}}, sum
}

func TestImagesAndTheirChecksumFiles(t *testing.T) {
	images, sum := newImages(t, "disk image bytes")
	m := NewMetrics()
	srv := serve(t, images, m)
	base := srv.URL + "/images/" + string(sum) + "/"
	for _, name := range []string{"good.raw", "renamed.raw"} {
		if resp, body := get(t, base+name); resp.StatusCode != http.StatusOK || body != "disk image bytes" || resp.Header.Get("ETag") != `"`+string(sum)+`"` {
			t.Errorf("GET %s: %s %q etag %s", name, resp.Status, body, resp.Header.Get("ETag"))
		}
		if resp, body := get(t, base+name+".sha256sum"); resp.StatusCode != http.StatusOK || body != string(sum)+"  "+name+"\n" {
			t.Errorf("GET %s.sha256sum: %s %q", name, resp.Status, body)
		}
		if resp, body := get(t, base+name+".md5sum"); resp.StatusCode != http.StatusOK || body != "0123456789abcdef0123456789abcdef  "+name+"\n" {
			t.Errorf("GET %s.md5sum: %s %q", name, resp.Status, body)
		}
	}
	// Two image downloads of 16 bytes counted; checksum files are not.
	if _, body := get(t, srv.URL+"/metrics"); !strings.Contains(body, "osimages_http_served_bytes_total 32\n") {
		t.Errorf("served bytes not counted as two downloads of 16 bytes:\n%s", grep(body, "served_bytes"))
	}
	for _, path := range []string{base + "other.raw", base + "good.raw.sha512sum", base + "renamed", srv.URL + "/images/" + string(sha('b')) + "/good.raw", srv.URL + "/images/..%2f..%2fetc/passwd"} {
		if resp, _ := get(t, path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s; want 404", path, resp.Status)
		}
	}
}

func grep(body, word string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestNotReadyTamperedAndEmptyRanges(t *testing.T) {
	images, sum := newImages(t, "disk image bytes")
	srv := serve(t, images, nil)
	url := srv.URL + "/images/" + string(sum) + "/good.raw"
	// Go's ServeContent would answer bytes=-0 with an invalid 206.
	if resp, _ := get(t, url, "Range", "bytes=-0"); resp.StatusCode != http.StatusRequestedRangeNotSatisfiable || resp.Header.Get("Content-Range") != "bytes */16" {
		t.Errorf("bytes=-0: %s %q; want 416 bytes */16", resp.Status, resp.Header.Get("Content-Range"))
	}
	if resp, body := get(t, url, "Range", "bytes=-0, 0-3"); resp.StatusCode != http.StatusPartialContent || body != "disk" || resp.Header.Get("Content-Range") != "bytes 0-3/16" {
		t.Errorf("bytes=-0, 0-3: %s %q %q; want 206 disk", resp.Status, body, resp.Header.Get("Content-Range"))
	}
	if resp, body := get(t, url, "Range", "bytes=-5"); resp.StatusCode != http.StatusPartialContent || body != "bytes" {
		t.Errorf("bytes=-5: %s %q; want 206 bytes", resp.Status, body)
	}
	images.tampered[sum] = true
	if resp, _ := get(t, url); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "30" || len(images.dropped) != 1 {
		t.Errorf("tampered: %s retry %q dropped %v; want 503 after 30 s, the server told", resp.Status, resp.Header.Get("Retry-After"), images.dropped)
	}
	img := images.images[sum]
	img.Stored, img.Phase = false, imagelife.PhaseDownloading
	images.images[sum] = img
	if resp, _ := get(t, url+".sha256sum"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "30" {
		t.Errorf("not ready: %s; want 503 with Retry-After", resp.Status)
	}
	if resp, _ := get(t, srv.URL+"/readyz"); resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz: %s", resp.Status)
	}
	images.ready = false
	if resp, body := get(t, srv.URL+"/readyz"); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "peers serve") {
		t.Errorf("/readyz not ready: %s %q", resp.Status, body)
	}
}

// A status page whose template fails answers 500, never a 200 with the
// part of the page written before the failure.
func TestStatusPageIsNeverHalfWritten(t *testing.T) {
	images, _ := newImages(t, "x")
	srv := serve(t, images, nil)
	if resp, body := get(t, srv.URL+"/"); resp.StatusCode != http.StatusOK || !strings.Contains(body, `href="/images/`+string(sha('a'))+`/a.raw"`) {
		t.Fatalf("the status page: %s, without the image's link:\n%s", resp.Status, body)
	}
	working := statusPage
	broken := template.Must(template.New("status").Parse(`<html><body>half {{.NoSuchField}}</body></html>`))
	statusPage = func() *template.Template { return broken }
	t.Cleanup(func() { statusPage = working })
	if resp, body := get(t, srv.URL+"/"); resp.StatusCode != http.StatusInternalServerError || strings.Contains(body, "half") {
		t.Fatalf("a failing template: %s, %q; want 500 without the page's start", resp.Status, body)
	}
}

func TestServedFile(t *testing.T) {
	for _, tc := range []struct{ file, name, suffix string }{
		{"good.raw", "good.raw", ""},
		{"good.raw.sha256sum", "good.raw", ".sha256sum"},
		{"good.raw.md5sum", "good.raw", ".md5sum"},
		// The filename itself wins over a checksum reading of it.
		{"odd.md5sum", "odd.md5sum", ""},
		{"other.raw", "", ""},
	} {
		name, suffix, ok := servedFile([]string{"good.raw", "odd.md5sum", "odd"}, tc.file)
		if name != tc.name || suffix != tc.suffix || ok != (tc.name != "") {
			t.Errorf("servedFile(%q) = %q %q %v; want %q %q", tc.file, name, suffix, ok, tc.name, tc.suffix)
		}
	}
}

// The checksum files answer with their own ETag and the image's
// Last-Modified, and honour conditional requests.
func TestChecksumFilesAreCacheable(t *testing.T) {
	images, sum := newImages(t, "a bytes")
	srv := serve(t, images, nil)
	url := srv.URL + "/images/" + string(sum) + "/good.raw"
	do := func(method, url string, header ...string) (*http.Response, string) {
		req, _ := http.NewRequest(method, url, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	image, _ := do(http.MethodHead, url)
	for _, ext := range []string{".sha256sum", ".md5sum"} {
		resp, body := do(http.MethodGet, url+ext)
		etag, modified := resp.Header.Get("ETag"), resp.Header.Get("Last-Modified")
		if resp.StatusCode != 200 || etag == "" || modified == "" {
			t.Fatalf("%s: %d, ETag %q, Last-Modified %q", ext, resp.StatusCode, etag, modified)
		}
		if etag == image.Header.Get("ETag") {
			t.Errorf("%s has the image's own ETag %s: a cache would mix them up", ext, etag)
		}
		if modified != image.Header.Get("Last-Modified") {
			t.Errorf("%s Last-Modified %q, want the image's %q", ext, modified, image.Header.Get("Last-Modified"))
		}
		if resp.Header.Get("Content-Length") != fmt.Sprint(len(body)) {
			t.Errorf("%s Content-Length %q for %d bytes", ext, resp.Header.Get("Content-Length"), len(body))
		}
		if again, _ := do(http.MethodGet, url+ext, "If-None-Match", etag); again.StatusCode != http.StatusNotModified {
			t.Errorf("%s If-None-Match: %d, want 304", ext, again.StatusCode)
		}
		if again, _ := do(http.MethodGet, url+ext, "If-Modified-Since", modified); again.StatusCode != http.StatusNotModified {
			t.Errorf("%s If-Modified-Since: %d, want 304", ext, again.StatusCode)
		}
		if head, hb := do(http.MethodHead, url+ext); head.StatusCode != 200 || len(hb) != 0 || head.Header.Get("Content-Length") != fmt.Sprint(len(body)) {
			t.Errorf("%s HEAD: %d, %d body bytes, Content-Length %q", ext, head.StatusCode, len(hb), head.Header.Get("Content-Length"))
		}
	}
}

// The http.Server serve runs closes idle keep-alive connections and
// bounds the wait for request headers.
func TestHTTPServerTimeouts(t *testing.T) {
	hs := Endpoints{Images: &fakeImages{}, SendTimeout: time.Minute}.Server()
	if hs.IdleTimeout <= 0 || hs.ReadHeaderTimeout <= 0 || hs.ConnContext == nil || hs.Handler == nil {
		t.Errorf("HTTPServer: idle %v, read header %v", hs.IdleTimeout, hs.ReadHeaderTimeout)
	}
}

// A failed image is answered for what it is: bytes that did not verify are
// refused (502), another failure is not ready (503), and Retry-After is
// the time to the next download when one is scheduled, absent when none is.
func TestFailedImages(t *testing.T) {
	images, sum := newImages(t, "disk image bytes")
	srv := serve(t, images, nil)
	url := srv.URL + "/images/" + string(sum) + "/good.raw"
	now := time.Now()
	for _, tc := range []struct {
		name    string
		failure string
		refused bool
		retryAt time.Time
		status  int
		// Retry-After within [lo, hi]; absent when hi is 0. The clock
		// moves between the test's reading and the server's.
		lo, hi int
		want   []string
	}{
		{"refused, retried", "sha256 mismatch: expected aa, got bb", true, now.Add(90 * time.Second), http.StatusBadGateway, 1, 90,
			[]string{"is not served: what its source gave did not verify (sha256 mismatch: expected aa, got bb)", "a new download is scheduled in"}},
		{"refused, deselected", "sha256 mismatch: expected aa, got bb", true, time.Time{}, http.StatusBadGateway, 0, 0,
			[]string{"did not verify", "no new download is scheduled"}},
		{"unreachable source", "connection refused at https://r.example", false, now.Add(-time.Second), http.StatusServiceUnavailable, 1, 1,
			[]string{"is not ready: its last download failed: connection refused at https://r.example", "a new download is scheduled in 1 s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			images.mu.Lock()
			images.images[sum] = Image{Served: true, Phase: imagelife.PhaseFailed, Filenames: []string{"good.raw"}, Failure: tc.failure, Refused: tc.refused, RetryAt: tc.retryAt}
			images.mu.Unlock()
			resp, body := get(t, url)
			ra := resp.Header.Get("Retry-After")
			n, err := strconv.Atoi(ra)
			if resp.StatusCode != tc.status || tc.hi == 0 && ra != "" || tc.hi > 0 && (err != nil || n < tc.lo || n > tc.hi) {
				t.Errorf("%s, Retry-After %q; want %d, Retry-After in [%d, %d] (none for 0)", resp.Status, ra, tc.status, tc.lo, tc.hi)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("body lacks %q: %s", w, body)
				}
			}
		})
	}
}
