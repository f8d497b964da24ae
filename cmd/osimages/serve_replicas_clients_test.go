package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// stallGate, once closed, holds the requests it is given until the test
// ends: a source that stalls.
type stallGate struct {
	closed atomic.Bool
	held   atomic.Int64
	end    chan struct{}
}

func newStallGate(t *testing.T) *stallGate {
	g := &stallGate{end: make(chan struct{})}
	t.Cleanup(func() { close(g.end) })
	return g
}

// hold blocks r while the stallGate is closed and pass says no.
func (g *stallGate) hold(r *http.Request, pass bool) {
	if !g.closed.Load() || pass {
		return
	}
	g.held.Add(1)
	select {
	case <-g.end:
	case <-r.Context().Done():
	}
}

// TestServeReplicasAnswerClientsFromAPeerDuringAFill: Ironic's conductor
// checks an image URL with one HEAD, fails the host on anything but 200
// and does not retry (ironic/common/image_service.py, validate_href), so
// a replica asked for an image it is still filling answers from a peer's
// verified copy: the HEAD, the checksum files and the image itself, as
// Ironic's own HttpImageService downloads it. The replica here cannot
// fill at all (its peer's fills and the registry stall), so every answer
// is the peer's copy, relayed.
func TestServeReplicasAnswerClientsFromAPeerDuringAFill(t *testing.T) {
	registryGate := newStallGate(t)
	reg := testenv.Registry(t, devregistry.Options{Middleware: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			registryGate.hold(r, !strings.Contains(r.URL.Path, "/blobs/"))
			next.ServeHTTP(w, r)
		})
	}})
	args, sums, _ := replicaImages(t, reg, 3<<20)
	published := map[osimage.SHA256]devregistry.Published{}
	for _, p := range publishedFor(t, reg) {
		published[imageSHA(t, p)] = p
	}
	// a's peer listener, behind a stallGate that holds the fills but lets the
	// relayed requests of clients through.
	peerGate := newStallGate(t)
	advertise := func(peerAddr string) string {
		target, _ := url.Parse("http://" + peerAddr)
		proxy := httputil.NewSingleHostReverseProxy(target)
		addr := testenv.FreePeerAddr(t)
		srv := &http.Server{Addr: addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			peerGate.hold(r, r.URL.Path == replica.StatePath || r.Header.Get(replica.RelayHeader) != "")
			proxy.ServeHTTP(w, r)
		})}
		go srv.ListenAndServe()
		t.Cleanup(func() { srv.Close() })
		return addr
	}
	rs := newReplicaSet(t, args...)
	a := rs.start("a", advertise)
	testenv.Eventually(t, "a holds both images", 60*time.Second, func() (bool, string) {
		return a.holds(sums...), fmt.Sprint(a.state()) + a.d.stderr.String()
	})
	registryGate.closed.Store(true)
	peerGate.closed.Store(true)
	// b's fills stall at the gate for as long as the test lasts; a fill
	// cut for --peer-timeout would mark a as failed, and a peer that
	// failed is no longer relayed from: the bound is far beyond the test.
	b := rs.start("b", nil, "--client-hold", "1s", "--peer-timeout", "10m")
	testenv.Eventually(t, "b fills both images from a, held at the stallGate", 60*time.Second, func() (bool, string) {
		st := b.state()
		if st == nil {
			return false, "b does not answer"
		}
		for _, sum := range sums {
			if !st.Images[sum].FillsFromPeer() {
				return false, fmt.Sprint(st)
			}
		}
		return true, ""
	})

	for _, sum := range sums {
		p := published[sum]
		name := p.Fields.Get(osimage.FieldFilename)
		size, _ := strconv.ParseInt(p.Fields.Get(osimage.FieldSize), 10, 64)
		imageURL := b.d.url(osimage.ImagePath(sum, name))
		// The conductor's HEAD.
		resp, err := http.Head(imageURL)
		if err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength != size {
			t.Fatalf("HEAD %s of b, which is still filling it: %v, %v; want 200 with Content-Length %d", name, err, resp, size)
		}
		// The checksum files.
		for suffix, want := range map[string]string{".sha256sum": string(sum), ".md5sum": p.Fields.Get(osimage.FieldMD5)} {
			body := httpGet(t, imageURL+suffix)
			if body != want+"  "+name+"\n" {
				t.Errorf("GET %s%s of b: %q, want %q", name, suffix, body, want+"  "+name+"\n")
			}
		}
		// The image.
		resp, err = http.Get(imageURL)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != string(sum) {
			t.Fatalf("GET %s of b: %s, %v, %d bytes of sha256 %x; want 200 and the %d bytes of %s", name, resp.Status, err, n, h.Sum(nil), size, sum)
		}
	}
	// The same through oci://: the manifest (of the declared size, which
	// a's copy was verified against) and the blob, from a's copy.
	for _, sum := range sums {
		size, _ := strconv.ParseInt(published[sum].Fields.Get(osimage.FieldSize), 10, 64)
		body, manifest := osimage.OCIManifest(sum, size)
		repo := "/v2/" + osimage.OCIRepository(sum)
		if got := httpGet(t, b.d.url(repo+"/manifests/"+manifest.String())); got != string(body) {
			t.Fatalf("manifest of %s from b, which is still filling it: %s, want %s", sum, got, body)
		}
		resp, err := http.Get(b.d.url(repo + "/blobs/" + osimage.OCILayerDigest(sum).String()))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != string(sum) || resp.Header.Get("Docker-Content-Digest") != osimage.OCILayerDigest(sum).String() {
			t.Fatalf("blob of %s from b: %s, %v, %d bytes of sha256 %x, digest header %q", sum, resp.Status, err, n, h.Sum(nil), resp.Header.Get("Docker-Content-Digest"))
		}
	}
	if b.holds(sums[0]) || b.holds(sums[1]) {
		t.Fatalf("b holds an image: its fills were meant to stall, the answers to be relayed: %v", b.state())
	}
	if peerGate.held.Load() == 0 {
		t.Fatal("no fill of b was held at a's stallGate")
	}

	t.Run("Ironic's HttpImageService", func(t *testing.T) {
		p := published[sums[0]]
		ironicDownload(t, b.d.url(osimage.ImagePath(sums[0], p.Fields.Get(osimage.FieldFilename))), sums[0], p.Fields.Get(osimage.FieldSize))
	})

	// An image no replica holds verified yet is held --client-hold, then
	// answered 503 with Retry-After, never with bytes of a fill.
	t.Run("no verified copy anywhere", func(t *testing.T) {
		c := rs.start("c", nil, "--client-hold", "1s", "--peers-service", "nobody")
		testenv.Eventually(t, "c queues or pulls the images", 60*time.Second, func() (bool, string) {
			st := c.state()
			return st != nil && len(st.Images) == len(sums), fmt.Sprint(st)
		})
		p := published[sums[0]]
		resp, err := http.Get(c.d.url(osimage.ImagePath(sums[0], p.Fields.Get(osimage.FieldFilename))))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("GET of an image no replica holds: %s, Retry-After %q; want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
		}
	})
}

func httpGet(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", u, resp.Status, body)
	}
	return string(body)
}

// ironicDownload runs Ironic's own HttpImageService as the conductor
// uses it (testenv.Ironic): show (the HEAD), the checksum file, then the
// download, checked in transit. It ends the test through testenv.Missing
// where the code or the libraries are absent.
func ironicDownload(t *testing.T, imageURL string, sum osimage.SHA256, size string) {
	t.Helper()
	got, why := testenv.Ironic(t, "", imageURL)
	if why != "" {
		testenv.Missing(t, "%s", why)
	}
	n, err := strconv.ParseInt(size, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := testenv.CheckIronicHTTP(got[0], string(sum), n); err != nil {
		t.Fatal(err)
	}
	t.Logf("Ironic's HttpImageService: HEAD size %d, checksum file and transfer verified %s", got[0].Size(), got[0].Verified)
}
