package imagehttp

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/ocidist"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// lookups counts the Lookups of the images it wraps, so that a test knows
// a request is held without timing it.
type lookups struct {
	*fakeImages
	n atomic.Int64
}

func (l *lookups) Lookup(sum osimage.SHA256) (Image, bool) {
	l.n.Add(1)
	return l.fakeImages.Lookup(sum)
}

// fakePeers holds what the test says, and serves a fixed body.
type fakePeers struct {
	holds  atomic.Bool
	served atomic.Int64
	body   string
}

func (p *fakePeers) Holds(osimage.SHA256) bool { return p.holds.Load() }

func (p *fakePeers) Serve(w http.ResponseWriter, _ *http.Request, _ osimage.SHA256, _ string) bool {
	if !p.holds.Load() {
		return false
	}
	p.served.Add(1)
	_, _ = w.Write([]byte(p.body))
	return true
}

func setPhase(f *fakeImages, sum osimage.SHA256, stored bool, phase imagelife.Phase) {
	f.mu.Lock()
	defer f.mu.Unlock()
	img := f.images[sum]
	img.Stored, img.Phase = stored, phase
	f.images[sum] = img
}

// TestARequestIsHeldUntilTheImageIsVerified: a client that asks for an
// image still downloading waits (up to Hold) and gets it once verified,
// instead of a 503 that Ironic's conductor would fail the host on.
func TestARequestIsHeldUntilTheImageIsVerified(t *testing.T) {
	images, sum := newImages(t, "disk image bytes")
	setPhase(images, sum, false, imagelife.PhaseDownloading)
	l := &lookups{fakeImages: images}
	srv := httptest.NewServer(Endpoints{Images: l, SendTimeout: time.Minute, Hold: time.Minute}.Handler())
	t.Cleanup(srv.Close)

	type answer struct {
		code int
		body string
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/images/" + string(sum) + "/good.raw")
		if err != nil {
			got <- answer{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		got <- answer{resp.StatusCode, string(body)}
	}()
	// Held: it looks again and again (a request answered at once looks
	// twice), and is not answered.
	for l.n.Load() < 4 {
		select {
		case a := <-got:
			t.Fatalf("answered %d %q while the image downloads, want the request held", a.code, a.body)
		case <-time.After(10 * time.Millisecond):
		}
	}
	setPhase(images, sum, true, imagelife.PhaseReady)
	if a := <-got; a.code != http.StatusOK || a.body != "disk image bytes" {
		t.Fatalf("once verified: %d %q, want 200 and the image", a.code, a.body)
	}
}

// TestAnImageAPeerHoldsIsServedFromThePeer: not verified here, held by a
// peer: the image comes from the peer, the checksum files from here (the
// URL's sha256 and the catalog's md5); when the peer cannot answer after
// all, or nobody holds it and Hold is 0, the answer is 503 with
// Retry-After at once.
func TestAnImageAPeerHoldsIsServedFromThePeer(t *testing.T) {
	images, sum := newImages(t, "disk image bytes")
	setPhase(images, sum, false, imagelife.PhaseDownloading)
	peers := &fakePeers{body: "the peer's verified copy"}
	peers.holds.Store(true)
	srv := httptest.NewServer(Endpoints{Images: images, SendTimeout: time.Minute, Peers: peers}.Handler())
	t.Cleanup(srv.Close)
	base := srv.URL + "/images/" + string(sum) + "/good.raw"

	if resp, body := get(t, base); resp.StatusCode != http.StatusOK || body != peers.body {
		t.Fatalf("GET: %d %q, want the peer's copy", resp.StatusCode, body)
	}
	if resp, body := get(t, base+".sha256sum"); resp.StatusCode != http.StatusOK || body != string(sum)+"  good.raw\n" {
		t.Fatalf("GET .sha256sum: %d %q", resp.StatusCode, body)
	}
	if resp, body := get(t, base+".md5sum"); resp.StatusCode != http.StatusOK || body != "0123456789abcdef0123456789abcdef  good.raw\n" {
		t.Fatalf("GET .md5sum: %d %q", resp.StatusCode, body)
	}
	if peers.served.Load() != 1 {
		t.Fatalf("the peer served %d requests, want 1 (the checksum files are answered here)", peers.served.Load())
	}
	peers.holds.Store(false)
	if resp, _ := get(t, base); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("nobody holds it, Hold 0: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// ociImages is the OCI face's view of the same images (what the server's
// servedImages.Image gives it).
type ociImages struct{ l *lookups }

func (o ociImages) Image(sum osimage.SHA256) (ocidist.Image, bool) {
	img, ok := o.l.Lookup(sum)
	if !ok || !img.Served {
		return ocidist.Image{}, false
	}
	return ocidist.Image{SHA256: sum, Ready: img.Stored && img.Phase == imagelife.PhaseReady, Size: int64(len("disk image bytes")), Filename: img.Filenames[0]}, true
}

// TestAnOCIRequestIsHeldAsAnImageURLIs: the manifest and the blob of an
// image still downloading are held as its image URL is (HoldFor, the one
// hold), and answered once it is verified: Ironic's agent ignores
// Retry-After, and an oci:// deploy must survive a fill as an http one
// does.
func TestAnOCIRequestIsHeldAsAnImageURLIs(t *testing.T) {
	const content = "disk image bytes"
	manifest, digest := osimage.OCIManifest(osimage.SHA256(fmt.Sprintf("%x", sha256.Sum256([]byte(content)))), int64(len(content)))
	for _, tc := range []struct{ name, path, want string }{
		{"blob", "/blobs/" + fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(content))), content},
		{"manifest", "/manifests/" + digest.String(), string(manifest)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			images, sum := newImages(t, content)
			setPhase(images, sum, false, imagelife.PhaseDownloading)
			l := &lookups{fakeImages: images}
			e := Endpoints{Images: l, SendTimeout: time.Minute, Hold: time.Minute}
			e.Registry = ocidist.Registry{Images: ociImages{l}, ServeBlob: e.ServeStored, Hold: e.HoldFor, RetryAfterSeconds: RetryAfterSeconds}.Handler()
			srv := httptest.NewServer(e.Handler())
			t.Cleanup(srv.Close)

			type answer struct {
				code int
				body string
			}
			got := make(chan answer, 1)
			go func() {
				resp, err := http.Get(srv.URL + "/v2/" + osimage.OCIRepository(sum) + tc.path)
				if err != nil {
					got <- answer{0, err.Error()}
					return
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				got <- answer{resp.StatusCode, string(body)}
			}()
			// Held: it looks again and again (a request answered at once
			// looks twice at most), and is not answered.
			for l.n.Load() < 4 {
				select {
				case a := <-got:
					t.Fatalf("answered %d %q while the image downloads, want the request held as an image URL's is", a.code, a.body)
				case <-time.After(10 * time.Millisecond):
				}
			}
			setPhase(images, sum, true, imagelife.PhaseReady)
			if a := <-got; a.code != http.StatusOK || a.body != tc.want {
				t.Fatalf("once verified: %d %q, want 200 and %q", a.code, a.body, tc.want)
			}
		})
	}
}
