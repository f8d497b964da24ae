package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// peerTraffic counts the bytes a replica's peer listener sends, by kind:
// the compressed layer of a download in progress, or the image.
type peerTraffic struct {
	blob, image atomic.Int64
	flipped     atomic.Int64
}

// peerProxy forwards to a replica's peer listener, counting what it sends
// in tr; with flipBlobs, it flips a byte in every compressed layer it sends.
func peerProxy(t *testing.T, tr *peerTraffic, flipBlobs bool) func(string) string {
	return proxyPeer(t, func(resp *http.Response) {
		path := resp.Request.URL.Path
		switch {
		case strings.HasPrefix(path, "/peer/blobs/") && !strings.HasSuffix(path, "/descriptor"):
			var body io.ReadCloser = resp.Body
			if flipBlobs {
				body = &flipReader{ReadCloser: body, at: 64 << 10, flipped: &tr.flipped}
			}
			resp.Body = &countReader{ReadCloser: body, n: &tr.blob}
		case strings.HasPrefix(path, "/images/"):
			resp.Body = &countReader{ReadCloser: resp.Body, n: &tr.image}
		}
	})
}

// proxyPeer returns the advertise function of rs.start for a proxy, on
// this machine's address, in front of a replica's peer listener, whose
// responses pass through modify.
func proxyPeer(t *testing.T, modify func(*http.Response)) func(string) string {
	return func(peerAddr string) string {
		target, _ := url.Parse("http://" + peerAddr)
		proxy := httputil.NewSingleHostReverseProxy(target)
		// The tests cut responses on purpose.
		proxy.ErrorLog = log.New(io.Discard, "", 0)
		// Each byte goes on as it comes, as from the replica itself.
		proxy.FlushInterval = -1
		proxy.ModifyResponse = func(resp *http.Response) error {
			modify(resp)
			return nil
		}
		addr := testenv.FreePeerAddr(t)
		srv := &http.Server{Addr: addr, Handler: proxy, ErrorLog: log.New(io.Discard, "", 0)}
		go srv.ListenAndServe()
		t.Cleanup(func() { srv.Close() })
		return addr
	}
}

type countReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestServeReplicasFillFromTheCompressedLayer: followers of a registry
// pull of a gzip layer stream the layer as it arrives (about a quarter of
// the image here), not the image the puller writes.
func TestServeReplicasFillFromTheCompressedLayer(t *testing.T) {
	counter := &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, blobBytes := replicaImages(t, reg, 24<<20)
	plain := publishedFor(t, reg)[0]
	for _, p := range publishedFor(t, reg) {
		if p.Fields.Get("compression") == "gz" {
			plain = p
		}
	}
	plainSum := imageSHA(t, plain)
	var archive, size int64
	fmt.Sscan(plain.Fields.Get("archive-size"), &archive)
	fmt.Sscan(plain.Fields.Get("size"), &size)
	if archive <= 0 || archive*2 > size {
		t.Fatalf("the gz test image is %d bytes compressed for %d: the test needs a layer well smaller than the image", archive, size)
	}
	ids := []string{"r0", "r1", "r2"}
	puller := replica.Rendezvous(plainSum.String(), ids)[0]
	rs := newReplicaSet(t, args...)
	traffic := map[string]*peerTraffic{}
	for _, id := range ids {
		traffic[id] = &peerTraffic{}
		rs.start(id, peerProxy(t, traffic[id], false))
	}
	rs.waitHold(ids, sums...)
	if sent := counter.sent.Load(); sent < blobBytes || float64(sent) > 1.05*float64(blobBytes) {
		t.Errorf("the registry sent %d blob bytes for blobs of %d in all: want each once", sent, blobBytes)
	}
	for _, id := range ids {
		if id == puller {
			continue
		}
		if src := rs.get(id).state().Images[plainSum].Source; src != "peer "+puller {
			t.Errorf("%s filled the gz image from %q, want peer %s (the rendezvous puller)", id, src, puller)
		}
	}
	// Two followers took the layer from the puller: twice the compressed
	// size (the raw image, hardened, is copied as is and counted apart).
	got := traffic[puller].blob.Load()
	t.Logf("puller %s sent %d bytes of compressed layer (layer %d, image %d) and %d bytes of images", puller, got, archive, size, traffic[puller].image.Load())
	if got < 2*archive || float64(got) > 2.1*float64(archive) {
		t.Errorf("the puller sent %d bytes of its compressed layer to two followers, want about 2 × %d", got, archive)
	}
	var rawPlain int64
	for _, id := range ids {
		rawPlain += traffic[id].image.Load()
	}
	// The hardened image is raw: its followers copy it (2 × its size at
	// most); anything above means the gz image was copied raw too.
	hardened := blobBytes - archive
	if rawPlain > 2*hardened {
		t.Errorf("the peers sent %d image bytes, more than the raw image's two copies (%d): the gz image was copied raw", rawPlain, 2*hardened)
	}
}

// TestServeReplicasRefuseACorruptedCompressedLayer: a puller whose
// compressed layer arrives corrupted at its followers is reported, and they
// fill from elsewhere.
func TestServeReplicasRefuseACorruptedCompressedLayer(t *testing.T) {
	counter := &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, _ := replicaImages(t, reg, 16<<20)
	plainSum := gzipImageSum(t, reg)
	ids := []string{"r0", "r1", "r2"}
	puller := replica.Rendezvous(plainSum.String(), ids)[0]
	rs := newReplicaSet(t, args...)
	bad := &peerTraffic{}
	for _, id := range ids {
		var advertise func(string) string
		if id == puller {
			advertise = peerProxy(t, bad, true)
		}
		rs.start(id, advertise)
	}
	rs.waitHold(ids, sums...)
	if bad.flipped.Load() == 0 {
		t.Fatalf("no compressed layer went through the corrupting proxy: the test proves nothing (%d image bytes went through it)", bad.image.Load())
	}
	reported := false
	for _, id := range ids {
		if id == puller {
			continue
		}
		logs := rs.get(id).d.stderr.String()
		if strings.Contains(logs, `"msg":"peer failed to fill an image; filling it from elsewhere","peer":"`+puller+`"`) &&
			strings.Contains(logs, `"reason":"bad-bytes"`) && strings.Contains(logs, "blob digest mismatch") {
			reported = true
		}
		if src := rs.get(id).state().Images[plainSum].Source; src == "peer "+puller {
			t.Errorf("%s kept the gz image from the corrupting puller %s", id, puller)
		}
	}
	if !reported {
		t.Errorf("no follower reported the puller %s's corrupted layer", puller)
	}
	for _, id := range ids {
		r := rs.get(id)
		if got, code := sha256Of(t, r.d.url("/images/"+plainSum.String()+"/"+imageFilename(t, r, plainSum))); code != 200 || got != plainSum.String() {
			t.Errorf("%s serves the gz image: %d, sha256 %s", id, code, got)
		}
	}
}

// holdThenCut passes the first after bytes of a body, then waits until
// released() (the puller committed), then fails: the proxy aborts the
// response, and the follower must resume.
type holdThenCut struct {
	io.ReadCloser
	after    int64
	read     int64
	held     func()
	released func() bool
	cuts     *atomic.Int64
}

func (h *holdThenCut) Read(p []byte) (int, error) {
	if h.read >= h.after {
		h.held()
		for deadline := time.Now().Add(30 * time.Second); !h.released() && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		h.cuts.Add(1)
		return 0, io.ErrUnexpectedEOF
	}
	n, err := h.ReadCloser.Read(p[:min(int64(len(p)), h.after-h.read)])
	h.read += int64(n)
	return n, err
}

// TestServeReplicasCopyTheImageWhenThePullerCommitsMidStream: a follower
// whose stream of the puller's compressed layer is cut, and which asks for
// the rest only after the puller committed the image (and removed the
// layer), copies the image from the puller rather than report it failed.
// Before, the 404 of the layer counted as a failed peer.
func TestServeReplicasCopyTheImageWhenThePullerCommitsMidStream(t *testing.T) {
	// The registry trickles until a follower streams the puller's layer,
	// so that the puller is still downloading when the followers start;
	// then it lets the puller finish at once.
	counter := &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, blobBytes := replicaImages(t, reg, 16<<20)
	gzSum := gzipImageSum(t, reg)
	ids := []string{"r0", "r1", "r2"}
	puller := replica.Rendezvous(gzSum.String(), ids)[0]
	rs := newReplicaSet(t, args...)
	var cuts atomic.Int64
	for _, id := range ids {
		var advertise func(string) string
		if id == puller {
			advertise = proxyPeer(t, func(resp *http.Response) {
				if resp.StatusCode == http.StatusOK && resp.Request.URL.Path == "/peer/blobs/"+gzSum.String() {
					resp.Body = &holdThenCut{ReadCloser: resp.Body, after: 64 << 10, cuts: &cuts,
						held:     func() { counter.trickle.Store(false) },
						released: func() bool { return rs.get(puller).holds(gzSum) }}
				}
			})
		}
		rs.start(id, advertise)
	}
	rs.waitHold(ids, sums...)
	if cuts.Load() == 0 {
		t.Fatal("no follower's stream of the layer was cut: the test proves nothing")
	}
	for _, id := range ids {
		if id == puller {
			continue
		}
		logs := rs.get(id).d.stderr.String()
		if strings.Contains(logs, "peer failed to fill an image") {
			t.Errorf("%s reported a peer failed:\n%s", id, logs)
		}
		if src := rs.get(id).state().Images[gzSum].Source; src != "peer "+puller {
			t.Errorf("%s filled the gz image from %q, want peer %s", id, src, puller)
		}
	}
	if sent := counter.sent.Load(); float64(sent) > 1.05*float64(blobBytes) {
		t.Errorf("the registry sent %d blob bytes for blobs of %d in all: want each once", sent, blobBytes)
	}
}

// gzipImageSum is the sha256 of the image replicaImages published with a
// gzip layer.
func gzipImageSum(t *testing.T, reg *devregistry.Registry) osimage.SHA256 {
	t.Helper()
	for _, p := range publishedFor(t, reg) {
		if p.Fields.Get("compression") == "gz" {
			return imageSHA(t, p)
		}
	}
	t.Fatal("replicaImages published no gzip layer")
	return ""
}

// gzipLayer is gzipImageSum with the size and digest of its layer, which
// the registry proxy counts.
func gzipLayer(t *testing.T, reg *devregistry.Registry) (sum osimage.SHA256, size int64, digest string) {
	t.Helper()
	sum = gzipImageSum(t, reg)
	for _, p := range publishedFor(t, reg) {
		if imageSHA(t, p) == sum {
			if _, err := fmt.Sscan(p.Fields.Get("archive-size"), &size); err != nil {
				t.Fatalf("archive-size of the gzip image: %v", err)
			}
			digest = p.LayerDigest.String()
		}
	}
	return sum, size, digest
}

// waitHold waits until every replica of ids holds every image of sums
// verified.
func (rs *replicaSet) waitHold(ids []string, sums ...osimage.SHA256) {
	rs.t.Helper()
	testenv.Eventually(rs.t, "every replica holds every image", 120*time.Second, func() (bool, string) {
		for _, id := range ids {
			if !rs.get(id).holds(sums...) {
				return false, id + " misses an image: " + fmt.Sprint(rs.get(id).state())
			}
		}
		return true, ""
	})
}

// TestServeReplicasWaitForAPeerThatHasNotReadTheSelection: a follower asks
// the puller of an image (the first in rendezvous order) for it as soon
// as it selects it, which can be before the puller has read the selection
// that names it: replicas read their inputs each at its own pace. The
// puller answers once it has, rather than 404 at once; before, the
// follower reported it failed and pulled the image from the registry
// itself.
func TestServeReplicasWaitForAPeerThatHasNotReadTheSelection(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishServeImages(t, reg, 4<<20)
	hardened := imageSHA(t, published["ubuntu-hardened"])
	plain := imageSHA(t, published["ubuntu-plain"])
	osImages := writeFile(t, "os-images.yaml", osImagesDocFor(published))
	both := writeFile(t, "both.yaml", mgmtServeValues+"oci_registry_insecure: true\nos_image_server_additional_selectors:\n  hardened: {hardened: true}\n")
	// The puller selects the plain image only, until its values change.
	lateValues := writeFile(t, "late.yaml", mgmtServeValues+"oci_registry_insecure: true\n")
	late, early := "r0", "r1"
	if replica.Rendezvous(hardened.String(), []string{late, early})[0] != late {
		late, early = early, late
	}
	rs := newReplicaSet(t, "--os-images", osImages, "--peer-timeout", "60s")
	var asked atomic.Bool
	lateR := rs.start(late, watchPeerRequests(t, "/images/"+hardened.String()+"/", &asked), "-f", lateValues)
	testenv.Eventually(t, "the puller holds the plain image", 60*time.Second, func() (bool, string) {
		return lateR.holds(plain), lateR.d.stderr.String()
	})
	earlyR := rs.start(early, nil, "-f", both)
	testenv.Eventually(t, "the follower asks the puller for the hardened image", 60*time.Second, func() (bool, string) {
		return asked.Load(), fmt.Sprint(earlyR.state())
	})
	if err := os.WriteFile(lateValues+".new", []byte(mgmtServeValues+"oci_registry_insecure: true\nos_image_server_additional_selectors:\n  hardened: {hardened: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(lateValues+".new", lateValues); err != nil {
		t.Fatal(err)
	}
	rs.waitHold([]string{late, early}, plain, hardened)
	if src := earlyR.state().Images[hardened].Source; src != "peer "+late {
		t.Errorf("the follower filled the hardened image from %q, want peer %s", src, late)
	}
	if logs := earlyR.d.stderr.String(); strings.Contains(logs, "peer failed to fill an image") {
		t.Errorf("the follower reported the puller failed:\n%s", logs)
	}
}

// watchPeerRequests is the advertise function of rs.start for a proxy in
// front of a replica's peer listener that sets asked once a request for a
// path under prefix came through.
func watchPeerRequests(t *testing.T, prefix string, asked *atomic.Bool) func(string) string {
	return func(peerAddr string) string {
		target, _ := url.Parse("http://" + peerAddr)
		proxy := httputil.NewSingleHostReverseProxy(target)
		proxy.ErrorLog = log.New(io.Discard, "", 0)
		proxy.FlushInterval = -1
		addr := testenv.FreePeerAddr(t)
		srv := &http.Server{Addr: addr, ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, prefix) {
				asked.Store(true)
			}
			proxy.ServeHTTP(w, r)
		})}
		go srv.ListenAndServe()
		t.Cleanup(func() { srv.Close() })
		return addr
	}
}
