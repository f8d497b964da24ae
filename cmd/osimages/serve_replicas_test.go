package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/server"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// The replica tests run real `serve` processes behind a headless Service
// whose EndpointSlices the test maintains, as the endpoint controller
// would (envtest has none): one slice per process, since each has its own
// ports on 127.0.0.1, ready while the process answers /readyz.

const peersService = "osimages-peers"

type serverReplica struct {
	id       string
	d        *serveProcess
	httpAddr string
	peerAddr string
	// advertised is the peer address the EndpointSlice names (a proxy in
	// front of peerAddr, say).
	advertised string
	removed    atomic.Bool // its endpoint is taken out of the Service
	// unlisted: its endpoint is not in the Service yet (a pod without an
	// address).
	unlisted atomic.Bool
}

type replicaSet struct {
	t        *testing.T
	k        *testenv.Kube
	ns       string
	args     []string
	mu       sync.Mutex
	replicas map[string]*serverReplica
}

// blobCounter counts the blob bytes the registry sends, and can trickle
// them.
type blobCounter struct {
	sent    atomic.Int64
	trickle atomic.Bool
	// byDigest counts the bytes sent of each blob, by digest.
	byDigest sync.Map
}

// sentOf is the bytes sent of the blob of digest d.
func (c *blobCounter) sentOf(d string) int64 {
	if n, ok := c.byDigest.Load(d); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func (c *blobCounter) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, d, ok := strings.Cut(r.URL.Path, "/blobs/"); r.Method == http.MethodGet && ok {
			n, _ := c.byDigest.LoadOrStore(d, new(atomic.Int64))
			next.ServeHTTP(&countingResponse{ResponseWriter: w, c: c, blob: n.(*atomic.Int64)}, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

type countingResponse struct {
	http.ResponseWriter
	c    *blobCounter
	blob *atomic.Int64
}

func (w *countingResponse) Write(p []byte) (int, error) {
	if !w.c.trickle.Load() {
		n, err := w.ResponseWriter.Write(p)
		w.c.sent.Add(int64(n))
		w.blob.Add(int64(n))
		return n, err
	}
	written := 0
	for len(p) > 0 {
		n, err := w.ResponseWriter.Write(p[:min(len(p), 64<<10)])
		written += n
		w.c.sent.Add(int64(n))
		w.blob.Add(int64(n))
		if err != nil {
			return written, err
		}
		p = p[n:]
		w.ResponseWriter.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond)
	}
	return written, nil
}

func (w *countingResponse) ReadFrom(r io.Reader) (int64, error) { return io.Copy(writerOnly{w}, r) }

type writerOnly struct{ io.Writer }

func newReplicaSet(t *testing.T, args ...string) *replicaSet {
	k := apiserver(t)
	ns := fmt.Sprintf("scale-%d", time.Now().UnixNano()%1e9)
	if _, err := k.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rs := &replicaSet{t: t, k: k, ns: ns, args: args, replicas: map[string]*serverReplica{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rs.syncEndpoints(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return rs
}

// start runs replica id; advertise, when set, wraps its peer address. It
// expects a set of one (--replicas 1), unless extra or the set's
// arguments say otherwise.
func (rs *replicaSet) start(id string, advertise func(peerAddr string) string, extra ...string) *serverReplica {
	return rs.startListed(true, id, advertise, extra...)
}

// startListed runs replica id as start does; unless listed, its endpoint
// is left out of the Service until list is called.
func (rs *replicaSet) startListed(listed bool, id string, advertise func(peerAddr string) string, extra ...string) *serverReplica {
	t := rs.t
	peerAddr := testenv.FreePeerAddr(t)
	r := &serverReplica{id: id, httpAddr: freeAddr(t), peerAddr: peerAddr, advertised: peerAddr}
	if advertise != nil {
		r.advertised = advertise(peerAddr)
	}
	r.unlisted.Store(!listed)
	if listed {
		// Its endpoint is listed (not ready) before it starts, as a pod's
		// is once it has an address.
		rs.putSlice(context.Background(), r, false)
	}
	r.d = startServe(t, r.httpAddr, append([]string{"--kubeconfig", rs.k.Kubeconfig, "--replica-id", id, "--replicas", "1",
		"--peers-service", peersService, "--peer-listen", peerAddr, "--peer-timeout", "5s",
		"--output-configmap", rs.ns + "/served", "--data", t.TempDir(), "--keep-referenced=false"}, append(extra, rs.args...)...)...)
	rs.mu.Lock()
	rs.replicas[id] = r
	rs.mu.Unlock()
	return r
}

func (rs *replicaSet) get(id string) *serverReplica {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.replicas[id]
}

func (rs *replicaSet) syncEndpoints(ctx context.Context) {
	rs.mu.Lock()
	all := make([]*serverReplica, 0, len(rs.replicas))
	for _, r := range rs.replicas {
		all = append(all, r)
	}
	rs.mu.Unlock()
	slices := rs.k.Client.DiscoveryV1().EndpointSlices(rs.ns)
	for _, r := range all {
		if r.unlisted.Load() {
			continue
		}
		if r.removed.Load() {
			_ = slices.Delete(ctx, "osimages-"+r.id, metav1.DeleteOptions{})
			continue
		}
		ready := false
		select {
		case <-r.d.done:
		default:
			c := http.Client{Timeout: time.Second}
			if resp, err := c.Get(r.d.url("/readyz")); err == nil {
				resp.Body.Close()
				ready = resp.StatusCode == http.StatusOK
			}
		}
		rs.putSlice(ctx, r, ready)
	}
}

// putSlice creates or updates r's EndpointSlice.
func (rs *replicaSet) putSlice(ctx context.Context, r *serverReplica, ready bool) {
	slices := rs.k.Client.DiscoveryV1().EndpointSlices(rs.ns)
	name := "osimages-" + r.id
	_, httpPort := splitPort(rs.t, r.httpAddr)
	host, peerPort := splitPort(rs.t, r.advertised)
	want := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: rs.ns, Labels: map[string]string{discoveryv1.LabelServiceName: peersService}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{host},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: rs.ns, Name: r.id},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("peer"), Port: ptr.To(peerPort)}, {Name: ptr.To("http"), Port: ptr.To(httpPort)}},
	}
	cur, err := slices.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := slices.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			rs.t.Logf("creating EndpointSlice %s: %v", name, err)
		}
	case err == nil && (*cur.Endpoints[0].Conditions.Ready != ready || *cur.Ports[0].Port != peerPort):
		cur.Endpoints, cur.Ports = want.Endpoints, want.Ports
		_, _ = slices.Update(ctx, cur, metav1.UpdateOptions{})
	}
}

func splitPort(t *testing.T, addr string) (string, int32) {
	i := strings.LastIndex(addr, ":")
	p, err := strconv.Atoi(addr[i+1:])
	if err != nil {
		t.Fatalf("address %s: %v", addr, err)
	}
	return addr[:i], int32(p)
}

// state is a replica's /peer/state, nil when it does not answer.
func (r *serverReplica) state() *replica.State {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + r.peerAddr + "/peer/state")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st replica.State
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return nil
	}
	return &st
}

func (r *serverReplica) holds(sums ...osimage.SHA256) bool {
	st := r.state()
	if st == nil {
		return false
	}
	for _, s := range sums {
		if !st.Images[s].Verified() {
			return false
		}
	}
	return true
}

// outputLog records every version of the output ConfigMap, as a watch
// sees it, with when it was seen.
type outputLog struct {
	mu   sync.Mutex
	seen []observedOutput
}

type observedOutput struct {
	at  time.Time
	set osimage.ServedSet
}

func (rs *replicaSet) watchOutput() *outputLog {
	l := &outputLog{}
	ctx, cancel := context.WithCancel(context.Background())
	rs.t.Cleanup(cancel)
	w, err := rs.k.Client.CoreV1().ConfigMaps(rs.ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=served"})
	if err != nil {
		rs.t.Fatal(err)
	}
	go func() {
		for ev := range w.ResultChan() {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			s, err := osimage.ParseServed([]byte(cm.Data[osimage.ValuesKey]))
			if err != nil {
				continue
			}
			l.mu.Lock()
			l.seen = append(l.seen, observedOutput{at: time.Now(), set: s})
			l.mu.Unlock()
		}
	}()
	return l
}

func (l *outputLog) all() []observedOutput {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]observedOutput(nil), l.seen...)
}

func (l *outputLog) last() osimage.ServedSet {
	all := l.all()
	if len(all) == 0 {
		return nil
	}
	return all[len(all)-1].set
}

// lastPublished is what replicaImages published last (the tests of a
// package run one at a time).
var lastPublished []devregistry.Published

// replicaImages publishes the two test images and returns the serve
// arguments that select both, with their sha256s and blob sizes.
func replicaImages(t *testing.T, reg *devregistry.Registry, size int) (args []string, sums []osimage.SHA256, blobBytes int64) {
	published := publishServeImages(t, reg, size)
	lastPublished = nil
	for _, p := range published {
		lastPublished = append(lastPublished, p)
	}
	osImages := writeFile(t, "os-images.yaml", osImagesDocFor(published))
	mgmt := writeFile(t, "mgmt.yaml", mgmtServeValues+"oci_registry_insecure: true\nos_image_server_additional_selectors:\n  hardened: {hardened: true}\n")
	for _, p := range published {
		sums = append(sums, imageSHA(t, p))
		n, err := strconv.ParseInt(p.Fields.Get("archive-size"), 10, 64)
		if err != nil || n <= 0 {
			n, _ = strconv.ParseInt(p.Fields.Get("size"), 10, 64)
		}
		blobBytes += n
	}
	return []string{"--os-images", osImages, "-f", mgmt}, sums, blobBytes
}

// publishedFor is what replicaImages published, read back from the
// os_images document it wrote.
func publishedFor(t *testing.T, _ *devregistry.Registry) []devregistry.Published {
	return lastPublished
}

func publishers(rs *replicaSet) []string {
	var out []string
	for id, r := range rs.replicas {
		if strings.Contains(r.d.stderr.String(), `"msg":"served set published"`) {
			out = append(out, id)
		}
	}
	return out
}

func TestServeReplicasFillFromEachOther(t *testing.T) {
	// The registry trickles (about 3 MiB/s), so that followers stream
	// downloads in progress.
	counter := &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, blobBytes := replicaImages(t, reg, 6<<20)
	rs := newReplicaSet(t, args...)
	out := rs.watchOutput()
	for _, id := range []string{"r0", "r1", "r2"} {
		rs.start(id, nil)
	}
	testenv.Eventually(t, "every replica holds every image, and the output says available", 90*time.Second, func() (bool, string) {
		for _, id := range []string{"r0", "r1", "r2"} {
			if !rs.get(id).holds(sums...) {
				return false, id + " misses an image: " + fmt.Sprint(rs.get(id).state()) + rs.get(id).d.stderr.String()
			}
		}
		return allAvailable(out.last(), sums...), fmt.Sprint(out.last())
	})
	// The registry sent each blob once (5 % for resumes).
	if sent := counter.sent.Load(); sent < blobBytes || float64(sent) > 1.05*float64(blobBytes) {
		t.Errorf("the registry sent %d blob bytes for blobs of %d in all (%.2f×): want each once", sent, blobBytes, float64(sent)/float64(blobBytes))
	}
	// One publisher.
	if p := publishers(rs); len(p) != 1 {
		t.Errorf("the output was written by %v, want exactly one replica", p)
	}
	// Available only once all three held it: every version seen saying
	// available came after the verification of that image on each replica.
	verified := map[osimage.SHA256]time.Time{}
	for _, id := range []string{"r0", "r1", "r2"} {
		for sum, img := range rs.get(id).state().Images {
			if img.VerifiedAt.After(verified[sum]) {
				verified[sum] = img.VerifiedAt
			}
		}
	}
	for _, o := range out.all() {
		for sum, e := range o.set {
			if e.Available && o.at.Before(verified[sum]) {
				t.Errorf("image %s was published available at %s, before the last replica verified it at %s", sum, o.at.Format(time.StampMicro), verified[sum].Format(time.StampMicro))
			}
		}
	}
	// Each copy is the image.
	for _, id := range []string{"r0", "r1", "r2"} {
		for _, p := range sums {
			st := rs.get(id).state().Images[p]
			t.Logf("%s holds %s from %s", id, p[:12], st.Source)
		}
	}
}

// corruptingProxy forwards to a replica's peer listener and flips a byte
// in the middle of every image it sends.
func corruptingProxy(t *testing.T, flipped *atomic.Int64) func(string) string {
	return func(peerAddr string) string {
		target, _ := url.Parse("http://" + peerAddr)
		proxy := httputil.NewSingleHostReverseProxy(target)
		proxy.ModifyResponse = func(resp *http.Response) error {
			if strings.HasPrefix(resp.Request.URL.Path, "/images/") {
				resp.Body = &flipReader{ReadCloser: resp.Body, at: 1 << 20, flipped: flipped}
			}
			return nil
		}
		addr := testenv.FreePeerAddr(t)
		srv := &http.Server{Addr: addr, Handler: proxy}
		go srv.ListenAndServe()
		t.Cleanup(func() { srv.Close() })
		return addr
	}
}

type flipReader struct {
	io.ReadCloser
	off, at int64
	flipped *atomic.Int64
}

func (f *flipReader) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if f.at >= f.off && f.at < f.off+int64(n) {
		p[f.at-f.off] ^= 0xff
		f.flipped.Add(1)
	}
	f.off += int64(n)
	return n, err
}

// TestServeReplicasAvailableOnlyWhenEveryReadyReplicaHoldsIt: a ready
// replica that cannot store the images (its --max-storage is too small)
// keeps them unavailable, however many others hold them.
func TestServeReplicasAvailableOnlyWhenEveryReadyReplicaHoldsIt(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	args, sums, _ := replicaImages(t, reg, 2<<20)
	rs := newReplicaSet(t, args...)
	out := rs.watchOutput()
	// r0 holds the publisher's Lease (it led before), so that the replica
	// that lacks the images is not the one that judges them.
	now := metav1.NewMicroTime(time.Now())
	if _, err := rs.k.Client.CoordinationV1().Leases(rs.ns).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "osimages-server-publisher", Namespace: rs.ns},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("r0"), LeaseDurationSeconds: ptr.To[int32](60), AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	small := rs.start("small", nil, "--max-storage", "1Mi")
	testenv.Eventually(t, "the small replica is ready", 30*time.Second, func() (bool, string) {
		resp, err := http.Get(small.d.url("/readyz"))
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	rs.start("r0", nil)
	rs.start("r1", nil)
	leaderKnowsSmallLacks := func() (bool, string) {
		for _, id := range []string{"small", "r0", "r1"} {
			r := rs.get(id)
			if !strings.Contains(r.d.stderr.String(), "this replica leads") {
				continue
			}
			resp, err := http.Get(r.d.url("/"))
			if err != nil {
				return false, err.Error()
			}
			page, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, s := range sums {
				if !regexp.MustCompile(`data-replica="small" data-sha256="` + s.String() + `">.*phase failed`).Match(page) {
					return false, id + " leads but does not show small failing " + s.String()
				}
			}
			return true, ""
		}
		return false, "no leader yet"
	}
	testenv.Eventually(t, "r0 leads", 60*time.Second, func() (bool, string) {
		return strings.Contains(rs.get("r0").d.stderr.String(), "this replica leads"), ""
	})
	testenv.Eventually(t, "r0 and r1 hold every image, and the leader knows small lacks them", 90*time.Second, func() (bool, string) {
		for _, id := range []string{"r0", "r1"} {
			if !rs.get(id).holds(sums...) {
				return false, id + ": " + fmt.Sprint(rs.get(id).state())
			}
		}
		return leaderKnowsSmallLacks()
	})
	// The leader has been told since; a publication of either image as
	// available would have happened by now.
	testenv.Eventually(t, "the output is written", 30*time.Second, func() (bool, string) { return out.last() != nil, "" })
	for _, o := range out.all() {
		for _, s := range sums {
			if o.set[s].Available {
				t.Errorf("image %s published available at %s while the ready replica small cannot hold it", s[:12], o.at.Format(time.StampMicro))
			}
		}
	}
}

func TestServeReplicasReportACorruptingPeer(t *testing.T) {
	counter := &blobCounter{}
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, _ := replicaImages(t, reg, 4<<20)
	rs := newReplicaSet(t, args...)
	var flipped atomic.Int64
	bad := rs.start("bad", corruptingProxy(t, &flipped))
	testenv.Eventually(t, "the first replica holds every image", 60*time.Second, func() (bool, string) {
		return bad.holds(sums...), bad.d.stderr.String()
	})
	// The next replica finds a peer with verified copies, and gets bad
	// bytes from it: it refuses them, reports the peer, and fills from
	// the registry instead.
	// The second replica runs as a Pod would ($POD_NAME): it records an
	// event about the peer.
	t.Setenv("POD_NAME", "good-pod")
	good := rs.start("good", nil)
	testenv.Eventually(t, "the second replica holds every image", 90*time.Second, func() (bool, string) {
		return good.holds(sums...), fmt.Sprint(good.state()) + good.d.stderr.String()
	})
	if flipped.Load() == 0 {
		l, err := rs.k.Client.DiscoveryV1().EndpointSlices(rs.ns).List(context.Background(), metav1.ListOptions{})
		t.Fatalf("the corrupting proxy was never asked for an image: the test proves nothing\n%v %v\n%s", l, err, good.d.stderr.String())
	}
	st := good.state()
	for _, s := range sums {
		if st.Images[s].Source != fill.FromRegistry {
			t.Errorf("image %s came from %q, want the registry after the peer's bad bytes", s, st.Images[s].Source)
		}
		if got, code := sha256Of(t, good.d.url("/images/"+s.String()+"/"+imageFilename(t, good, s))); code != 200 || got != s.String() {
			t.Errorf("image %s served by the second replica: %d, sha256 %s", s, code, got)
		}
	}
	logs := good.d.stderr.String()
	if !strings.Contains(logs, `"msg":"peer failed to fill an image; filling it from elsewhere","peer":"bad"`) || !strings.Contains(logs, `"reason":"bad-bytes"`) {
		t.Errorf("no log line reports the peer:\n%s", logs)
	}
	testenv.Eventually(t, "an event reports the peer", 30*time.Second, func() (bool, string) {
		evs, err := rs.k.Client.EventsV1().Events(rs.ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "good-pod" && e.Reason == "PeerFillFailed" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "peer bad ") {
				return true, ""
			}
		}
		return false, fmt.Sprint(evs.Items)
	})
	resp, err := http.Get(good.d.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `osimages_peer_fill_failures_total{peer="bad",reason="bad-bytes"}`) {
		t.Errorf("no metric reports the peer:\n%s", body)
	}
}

// TestServeReplicasFallBackFromATricklingPeer: a peer that sends its
// verified images a byte every 200 ms never goes silent long enough for
// --peer-timeout, and no image waits for a slot; --min-rate still applies
// to a fill from a peer, and the registry takes over.
func TestServeReplicasFallBackFromATricklingPeer(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	args, sums, _ := replicaImages(t, reg, 2<<20)
	rs := newReplicaSet(t, args...)
	var trickled atomic.Int64
	slow := rs.start("slow", proxyPeer(t, func(resp *http.Response) {
		path := resp.Request.URL.Path
		if strings.HasPrefix(path, "/images/") || strings.HasPrefix(path, "/peer/blobs/") && !strings.HasSuffix(path, "/descriptor") {
			resp.Body = &trickleReader{ReadCloser: resp.Body, every: 200 * time.Millisecond, n: &trickled}
		}
	}))
	testenv.Eventually(t, "the first replica holds every image", 60*time.Second, func() (bool, string) {
		return slow.holds(sums...), slow.d.stderr.String()
	})
	// The window of --min-rate is --stall-timeout: the peer is given up
	// after one window of trickle, then the registry fills the image.
	good := rs.start("good", nil, "--stall-timeout", "3s", "--min-rate", "64Ki")
	testenv.Eventually(t, "the second replica holds every image", 90*time.Second, func() (bool, string) {
		return good.holds(sums...), fmt.Sprint(good.state()) + good.d.stderr.String()
	})
	if trickled.Load() == 0 {
		t.Fatal("the trickling peer was never asked for an image: the test proves nothing")
	}
	for _, s := range sums {
		if src := good.state().Images[s].Source; src != fill.FromRegistry {
			t.Errorf("image %s came from %q, want the registry after the peer trickled", s[:12], src)
		}
	}
	logs := good.d.stderr.String()
	if !strings.Contains(logs, `"msg":"peer failed to fill an image; filling it from elsewhere","peer":"slow"`) || !strings.Contains(logs, `"reason":"slow"`) ||
		!strings.Contains(logs, "below --min-rate 64.0 KiB/s") {
		t.Errorf("no log line reports the slow peer:\n%s", logs)
	}
}

// trickleReader passes on one byte every interval.
type trickleReader struct {
	io.ReadCloser
	every time.Duration
	n     *atomic.Int64
}

func (r *trickleReader) Read(p []byte) (int, error) {
	time.Sleep(r.every)
	n, err := r.ReadCloser.Read(p[:min(len(p), 1)])
	r.n.Add(int64(n))
	return n, err
}

// imageFilename is the filename a replica serves sum under.
func imageFilename(t *testing.T, r *serverReplica, sum osimage.SHA256) string {
	resp, err := http.Get(r.d.url("/"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	i := strings.Index(string(page), "/images/"+sum.String()+"/")
	if i < 0 {
		t.Fatalf("the status page has no link to %s", sum)
	}
	rest := string(page[i+len("/images/"+sum.String()+"/"):])
	return rest[:strings.IndexByte(rest, '"')]
}

// servedChecker asks every live replica's client port for every image,
// over and over, and records any answer that is neither "not ready yet"
// nor the verified image: no unverified byte may ever reach a client.
func servedChecker(t *testing.T, rs *replicaSet, sums []osimage.SHA256, names map[osimage.SHA256]string) (stop func() (checks int, bad []string)) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var bad []string
	checks := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rs.mu.Lock()
			all := make([]*serverReplica, 0, len(rs.replicas))
			for _, r := range rs.replicas {
				all = append(all, r)
			}
			rs.mu.Unlock()
			for _, r := range all {
				for _, s := range sums {
					got, code := sha256Of(t, r.d.url("/images/"+s.String()+"/"+names[s]))
					mu.Lock()
					checks++
					if code == http.StatusOK && got != s.String() {
						bad = append(bad, fmt.Sprintf("%s served %s with sha256 %s", r.id, s, got))
					}
					mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() (int, []string) {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return checks, bad
	}
}

func TestServeReplicasTakeOverFromAKilledPuller(t *testing.T) {
	counter := &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, _ := replicaImages(t, reg, 8<<20)
	rs := newReplicaSet(t, args...)
	out := rs.watchOutput()
	ids := []string{"r0", "r1", "r2"}
	for _, id := range ids {
		rs.start(id, nil)
	}
	names := map[osimage.SHA256]string{}
	for _, p := range publishedFor(t, reg) {
		names[imageSHA(t, p)] = p.Fields.Get("filename")
	}
	stopChecks := servedChecker(t, rs, sums, names)
	// Find a replica pulling an image from the registry while another
	// streams it, and kill it.
	var victim string
	var target osimage.SHA256
	testenv.Eventually(t, "a registry pull followed by a peer", 60*time.Second, func() (bool, string) {
		states := map[string]*replica.State{}
		for _, id := range ids {
			if states[id] = rs.get(id).state(); states[id] == nil {
				return false, id + " does not answer yet"
			}
		}
		for _, id := range ids {
			for sum, img := range states[id].Images {
				if img.Source != fill.FromRegistry || img.Phase != server.PhaseDownloading || img.Received == 0 {
					continue
				}
				for _, other := range ids {
					if o := states[other].Images[sum]; other != id && o.Source == "peer "+id && o.Phase == server.PhaseDownloading {
						victim, target = id, sum
						return true, ""
					}
				}
			}
		}
		return false, fmt.Sprint(states)
	})
	rs.get(victim).d.kill(syscall.SIGKILL)
	t.Logf("killed %s while it pulled %s", victim, target[:12])
	var rest []string
	for _, id := range ids {
		if id != victim {
			rest = append(rest, id)
		}
	}
	testenv.Eventually(t, "the other replicas hold every image, and the output says available", 120*time.Second, func() (bool, string) {
		for _, id := range rest {
			if !rs.get(id).holds(sums...) {
				return false, id + ": " + fmt.Sprint(rs.get(id).state())
			}
		}
		return allAvailable(out.last(), sums...), fmt.Sprint(out.last())
	})
	checks, bad := stopChecks()
	if len(bad) > 0 {
		t.Errorf("unverified bytes served: %v", bad)
	}
	if checks < 10 {
		t.Errorf("only %d checks of the served images ran", checks)
	}
	took := false
	for _, id := range rest {
		if rs.get(id).state().Images[target].Source == fill.FromRegistry {
			took = true
		}
		if !strings.Contains(rs.get(id).d.stderr.String(), `"peer":"`+victim+`"`) {
			t.Logf("%s did not report %s (it was not following it)", id, victim)
		}
	}
	if !took {
		t.Errorf("no replica took over the registry pull of %s", target)
	}
	// Nothing published available before it was held by the replicas
	// that remain (the killed one counts as holding nothing).
	for _, o := range out.all() {
		for sum, e := range o.set {
			if !e.Available {
				continue
			}
			for _, id := range rest {
				if v := rs.get(id).state().Images[sum].VerifiedAt; o.at.Before(v) && sum == target {
					t.Errorf("%s published available at %s, before %s verified it at %s", sum[:12], o.at.Format(time.StampMicro), id, v.Format(time.StampMicro))
				}
			}
		}
	}
}

func TestServeReplicasScaleDownAndUp(t *testing.T) {
	counter := &blobCounter{}
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, blobBytes := replicaImages(t, reg, 4<<20)
	rs := newReplicaSet(t, args...)
	out := rs.watchOutput()
	for _, id := range []string{"r0", "r1", "r2"} {
		rs.start(id, nil)
	}
	holdAll := func(ids ...string) func() (bool, string) {
		return func() (bool, string) {
			for _, id := range ids {
				if !rs.get(id).holds(sums...) {
					return false, id + ": " + fmt.Sprint(rs.get(id).state())
				}
			}
			return allAvailable(out.last(), sums...), fmt.Sprint(out.last())
		}
	}
	testenv.Eventually(t, "3 replicas hold every image", 60*time.Second, holdAll("r0", "r1", "r2"))
	firstAvailable := len(out.all())

	// 3 → 1: the endpoints go first, then the processes (as a StatefulSet
	// scaled down does, with SIGTERM).
	for _, id := range []string{"r1", "r2"} {
		rs.get(id).removed.Store(true)
	}
	for _, id := range []string{"r1", "r2"} {
		rs.get(id).d.kill(syscall.SIGTERM)
	}
	testenv.Eventually(t, "r0 alone publishes", 60*time.Second, func() (bool, string) {
		return strings.Contains(rs.get("r0").d.stderr.String(), "this replica leads"), ""
	})
	testenv.Eventually(t, "r0 alone holds every image", 30*time.Second, holdAll("r0"))

	// 1 → 3: two new replicas with empty volumes fill from r0.
	before := counter.sent.Load()
	for _, id := range []string{"r3", "r4"} {
		rs.start(id, nil)
	}
	testenv.Eventually(t, "3 replicas again hold every image", 90*time.Second, holdAll("r0", "r3", "r4"))
	testenv.Eventually(t, "the new replicas are ready", 30*time.Second, func() (bool, string) {
		for _, id := range []string{"r3", "r4"} {
			resp, err := http.Get(rs.get(id).d.url("/readyz"))
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false, id + " " + resp.Status
			}
		}
		return true, ""
	})
	if more := counter.sent.Load() - before; more != 0 {
		t.Errorf("the registry sent %d more blob bytes when replicas were added: they must fill from r0", more)
	}
	if sent := counter.sent.Load(); float64(sent) > 1.05*float64(blobBytes) {
		t.Errorf("the registry sent %d blob bytes for blobs of %d", sent, blobBytes)
	}
	// From r0, or from the other new replica once it held the image
	// verified: a verified copy is preferred, whichever peer holds it.
	for _, id := range []string{"r3", "r4"} {
		for _, s := range sums {
			if src := rs.get(id).state().Images[s].Source; src != "peer r0" && src != "peer r3" && src != "peer r4" || src == "peer "+id {
				t.Errorf("%s filled %s from %q, want a peer", id, s[:12], src)
			}
		}
	}
	// No flap: once available, every image stayed available in every
	// version of the output written since.
	all := out.all()
	for _, o := range all[firstAvailable-1:] {
		for _, s := range sums {
			if !o.set[s].Available {
				t.Errorf("the output flapped: at %s image %s is %v", o.at.Format(time.StampMicro), s[:12], o.set[s])
			}
		}
	}
	if len(all) < firstAvailable {
		t.Fatal("the watch lost versions")
	}
}
