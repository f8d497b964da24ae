package replica

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// An image of the tests: its bytes and how the server wants it.
type testImage struct {
	data []byte
	w    servedset.Wanted
}

func newImage(t *testing.T, n int, seed uint64) testImage {
	t.Helper()
	data := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	sum := sha256.Sum256(data)
	sha, err := osimage.ParseSHA256(hex.EncodeToString(sum[:]))
	if err != nil {
		t.Fatal(err)
	}
	m := md5.Sum(data)
	return testImage{data: data, w: servedset.Wanted{SHA256: sha, Key: "k", Desc: osimage.Descriptor{
		Filename: "disk.raw", MD5: hex.EncodeToString(m[:]), Size: int64(n)}}}
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

// holder is a replica's server as the endpoints see it: one image, held
// verified in a real store, or downloaded into it, or not known yet.
type holder struct {
	store *imagestore.Store
	img   testImage
	// lie, when set, is served instead of the verified file.
	lie []byte
	// instance is the State's Instance.
	instance string

	mu       sync.Mutex
	known    bool
	stored   bool
	download *imagestore.Writer
	written  int64
	notify   chan struct{}
}

func newHolder(t *testing.T, img testImage) *holder {
	return &holder{store: openStore(t), img: img, notify: make(chan struct{})}
}

func (h *holder) changed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.notify)
	h.notify = make(chan struct{})
}

// storeVerified commits the image in the holder's store.
func (h *holder) storeVerified(t *testing.T) {
	t.Helper()
	w, err := h.store.Create(h.img.w.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(h.img.data); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(imagestore.Entry{SHA256: h.img.w.SHA256, MD5: h.img.w.Desc.MD5, Filename: "disk.raw", Size: int64(len(h.img.data)), VerifiedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.known, h.stored = true, true
	h.mu.Unlock()
	h.changed()
}

// startDownload makes the holder pull the image: its bytes are written
// into the download as write is called.
func (h *holder) startDownload(t *testing.T) (write func(n int)) {
	t.Helper()
	w, err := h.store.Resume(h.img.w.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Abort() })
	h.mu.Lock()
	h.known, h.download = true, w
	h.mu.Unlock()
	h.changed()
	return func(n int) {
		h.mu.Lock()
		from := h.written
		to := min(from+int64(n), int64(len(h.img.data)))
		h.written = to
		h.mu.Unlock()
		if _, err := w.Write(h.img.data[from:to]); err != nil {
			t.Error(err)
		}
		h.changed()
	}
}

func (h *holder) State() State {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := State{Replica: "origin", Instance: h.instance, Images: map[osimage.SHA256]Image{}}
	switch {
	case h.stored:
		st.Images[h.img.w.SHA256] = Image{Phase: imagelife.PhaseReady, Source: fill.FromRegistry, Size: int64(len(h.img.data))}
	case h.download != nil:
		st.Images[h.img.w.SHA256] = Image{Phase: imagelife.PhaseDownloading, Source: fill.FromRegistry, Received: h.written}
	}
	return st
}

func (h *holder) Offer(sum osimage.SHA256, name string) Offer {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sum != h.img.w.SHA256 || !h.known {
		return Offer{}
	}
	o := Offer{Known: name == "" || name == "disk.raw", Stored: h.stored, Size: int64(len(h.img.data))}
	if !h.stored && h.download != nil {
		o.Download, o.Started = h.download, h.written > 0
	}
	return o
}

func (h *holder) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.notify
}

func (h *holder) ServeStored(w http.ResponseWriter, r *http.Request, sum osimage.SHA256) {
	if h.lie != nil {
		http.ServeContent(w, r, "disk.raw", time.Time{}, bytes.NewReader(h.lie))
		return
	}
	f, e, err := h.store.Open(sum)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	http.ServeContent(w, r, e.Filename, e.VerifiedAt, f)
}

// serve starts the peer endpoints of h on a real socket.
func serve(t *testing.T, id string, h Holder, wait time.Duration) (Peer, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(Endpoints{Holder: h, Wait: wait, SendTimeout: time.Minute}.Handler())
	t.Cleanup(srv.Close)
	return Peer{ID: id, URL: srv.URL}, srv
}

// fillFrom fills img from src into a new store under rule, and returns
// what the store then holds, or the fill's error.
func fillFrom(t *testing.T, ctx context.Context, src fill.Source, rule fill.Rule, img testImage) ([]byte, error) {
	t.Helper()
	store := openStore(t)
	dst, err := store.Resume(img.w.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Abort()
	res, err := rule.Run(ctx, func(ctx context.Context, progress pull.Progress) (pull.Result, error) {
		return src.Fill(ctx, img.w, dst, progress)
	}, func(int64, int64) {})
	if err != nil {
		return nil, err
	}
	if err := dst.Commit(imagestore.Entry{SHA256: img.w.SHA256, MD5: res.MD5, Filename: "disk.raw", Size: res.Size, VerifiedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return os.ReadFile(filepath.Join(store.Dir(), string(img.w.SHA256), "disk.raw"))
}

func readStored(t *testing.T, store *imagestore.Store, sum osimage.SHA256) []byte {
	t.Helper()
	f, _, err := store.Open(sum)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestFillFromAPeersVerifiedCopy(t *testing.T) {
	img := newImage(t, 3<<20, 1)
	origin := newHolder(t, img)
	origin.storeVerified(t)
	p, _ := serve(t, "origin", origin, time.Second)
	src := Source{Peer: p, Puller: NewPuller(10 * time.Second), Wait: time.Second}
	if src.Name() != fill.FromPeerPrefix+"origin" {
		t.Errorf("the source is named %q", src.Name())
	}
	got := fillVerified(t, src, img)
	if !bytes.Equal(got, img.data) {
		t.Fatal("the follower's copy differs from the origin's")
	}
}

// fillVerified fills img from src into a new store and returns the
// committed file.
func fillVerified(t *testing.T, src fill.Source, img testImage) []byte {
	t.Helper()
	store := openStore(t)
	dst, err := store.Resume(img.w.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reported int64
	res, err := src.Fill(context.Background(), img.w, dst, func(received, _ int64) {
		mu.Lock()
		reported = max(reported, received)
		mu.Unlock()
	})
	if err != nil {
		_ = dst.Abort()
		t.Fatalf("fill: %v", err)
	}
	if res.Size != int64(len(img.data)) || reported != int64(len(img.data)) {
		t.Errorf("fill result size %d, progress reached %d; want %d", res.Size, reported, len(img.data))
	}
	if err := dst.Commit(imagestore.Entry{SHA256: img.w.SHA256, MD5: res.MD5, Filename: "disk.raw", Size: res.Size, VerifiedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return readStored(t, store, img.w.SHA256)
}

// A follower asks before the origin has even read the selection: the
// request waits for the origin's download to start (on its change signal),
// then streams it as it is written.
func TestFillFollowsADownloadInProgress(t *testing.T) {
	img := newImage(t, 4<<20, 2)
	origin := newHolder(t, img)
	p, _ := serve(t, "origin", origin, 30*time.Second)
	src := Source{Peer: p, Puller: NewPuller(10 * time.Second), Wait: 30 * time.Second}
	go func() {
		time.Sleep(50 * time.Millisecond)
		write := origin.startDownload(t)
		for range 16 {
			write(256 << 10)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	got := fillVerified(t, src, img)
	if !bytes.Equal(got, img.data) {
		t.Fatal("the follower's copy differs from the origin's download")
	}
}

// A replica that does not serve the image says so (404) once it has waited;
// one that knows it but pulls nothing says "not yet" (503, Retry-After).
func TestEndpointsAnswerWhatTheyCannotSend(t *testing.T) {
	img := newImage(t, 1<<10, 3)
	h := newHolder(t, img)
	_, srv := serve(t, "r", h, 50*time.Millisecond)
	get := func(path string) *http.Response {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	path := osimage.ImagePath(img.w.SHA256, "disk.raw")
	if resp := get(path); resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown image: %s, want 404", resp.Status)
	}
	h.mu.Lock()
	h.known = true
	h.mu.Unlock()
	if resp := get(path); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a known image not pulled: %s, want 503 with Retry-After", resp.Status)
	}
	if resp := get(BlobPath(img.w.SHA256)); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("the layer of an image not pulled yet: %s, want 503", resp.Status)
	}
	if resp := get(osimage.ImagePath(img.w.SHA256, "other.raw")); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a name the image is not served under: %s, want 404", resp.Status)
	}
	var st State
	resp, err := http.Get(srv.URL + StatePath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Replica != "origin" {
		t.Errorf("state: %+v, %v", st, err)
	}
}

// A peer that sends other bytes of the right length is refused by the
// follower's own verification, reported, and the chain fills from the
// next source.
func TestAPeerThatLiesIsRefusedAndSkipped(t *testing.T) {
	img := newImage(t, 2<<20, 4)
	liar := newHolder(t, img)
	liar.storeVerified(t)
	liar.lie = bytes.Clone(img.data)
	liar.lie[1<<20] ^= 0xff
	p, _ := serve(t, "liar", liar, time.Second)

	_, err := fillFrom(t, context.Background(), Source{Peer: p, Puller: NewPuller(10 * time.Second)}, fill.Rule{}, img)
	if !errors.As(err, new(*pull.VerifyError)) {
		t.Fatalf("bytes of a lying peer: %v, want a verification error", err)
	}

	var failed []string
	registry := fill.Func{Label: fill.FromRegistry, F: func(_ context.Context, _ servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
		n, err := dst.Write(img.data)
		progress(int64(n), int64(n))
		return pull.Result{Size: int64(n), MD5: img.w.Desc.MD5, SHA256: string(img.w.SHA256)}, err
	}}
	chain := fill.Chain{
		Choose: func(servedset.Wanted) fill.Source {
			if len(failed) > 0 {
				return nil
			}
			return Source{Peer: p, Puller: NewPuller(10 * time.Second)}
		},
		Last:   registry,
		Rule:   func(fill.Source) fill.Rule { return fill.Rule{} },
		Failed: func(_ servedset.Wanted, src fill.Source, _ error) { failed = append(failed, src.Name()) },
	}
	store := openStore(t)
	dst, err := store.Resume(img.w.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Abort()
	_, from, err := chain.Fill(context.Background(), img.w, dst, func(int64, int64) {})
	if err != nil || from != fill.FromRegistry || len(failed) != 1 || failed[0] != "peer liar" {
		t.Fatalf("chain: filled from %q (%v), failed %v; want the registry after the liar", from, err, failed)
	}
}

// A peer that stops sending, or trickles, is cut by the fill's rule.
func TestAPeerThatStallsOrTricklesIsCut(t *testing.T) {
	img := newImage(t, 1<<20, 5)
	for _, tc := range []struct {
		name  string
		every time.Duration // a byte every; 0 never
		want  any
	}{
		{"stalls", 0, new(*fill.StallError)},
		{"trickles", 20 * time.Millisecond, new(*fill.SlowError)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(len(img.data)))
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				for i := 0; tc.every > 0; i++ {
					if _, err := w.Write(img.data[i : i+1]); err != nil {
						return
					}
					w.(http.Flusher).Flush()
					select {
					case <-time.After(tc.every):
					case <-r.Context().Done():
						return
					case <-done:
						return
					}
				}
				select {
				case <-r.Context().Done():
				case <-done:
				}
			}))
			defer srv.Close()
			defer close(done)
			src := Source{Peer: Peer{ID: "slow", URL: srv.URL}, Puller: NewPuller(time.Hour)}
			rule := fill.Rule{Stall: 300 * time.Millisecond, MinRate: 1 << 20, RateWindow: 300 * time.Millisecond}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := fillFrom(t, ctx, src, rule, img)
			if !errors.As(err, tc.want) || ctx.Err() != nil {
				t.Fatalf("got %v, want the rule's %T", err, tc.want)
			}
		})
	}
}

// The origin dies mid-stream: the follower's chain goes on from the next
// peer, which holds the image verified.
func TestTheOriginDyingHandsOverToTheNextPeer(t *testing.T) {
	img := newImage(t, 4<<20, 6)
	origin := newHolder(t, img)
	originPeer, originSrv := serve(t, "origin", origin, 10*time.Second)
	write := origin.startDownload(t)
	write(1 << 20)
	next := newHolder(t, img)
	next.storeVerified(t)
	nextPeer, _ := serve(t, "next", next, time.Second)

	var failed []string
	chain := fill.Chain{
		Choose: func(servedset.Wanted) fill.Source {
			for _, p := range []Peer{originPeer, nextPeer} {
				src := Source{Peer: p, Puller: NewPuller(10 * time.Second)}
				if !contains(failed, src.Name()) {
					return src
				}
			}
			return nil
		},
		Last: fill.Func{Label: fill.FromRegistry, F: func(context.Context, servedset.Wanted, *imagestore.Writer, pull.Progress) (pull.Result, error) {
			return pull.Result{}, errors.New("the registry is not to be asked")
		}},
		Rule:   func(fill.Source) fill.Rule { return fill.Rule{Stall: 20 * time.Second} },
		Failed: func(_ servedset.Wanted, src fill.Source, _ error) { failed = append(failed, src.Name()) },
	}
	store := openStore(t)
	dst, err := store.Resume(img.w.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Abort()
	var once sync.Once
	_, from, err := chain.Fill(context.Background(), img.w, dst, func(received, _ int64) {
		if received >= 512<<10 {
			// The follower has bytes of the origin: the origin dies.
			once.Do(func() { go originSrv.CloseClientConnections(); go originSrv.Close() })
		}
	})
	if err != nil || from != "peer next" || len(failed) != 1 || failed[0] != "peer origin" {
		t.Fatalf("filled from %q (%v), failed %v; want the next peer after the origin", from, err, failed)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// replicas is a replica set the test changes.
type replicas struct {
	mu          sync.Mutex
	self        string
	selfReady   bool
	ready, down []Peer
}

func (r *replicas) Self() string { return r.self }
func (r *replicas) Ready() []Peer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Peer(nil), r.ready...)
}
func (r *replicas) Listed() []Peer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(append([]Peer(nil), r.ready...), r.down...)
}
func (r *replicas) SelfReady() bool { return r.selfReady }
func (r *replicas) Synced() bool    { return true }

// statePeer answers a state the test sets.
type statePeer struct {
	Peer
	mu    sync.Mutex
	state State
}

func startStatePeer(t *testing.T, id string) *statePeer {
	p := &statePeer{state: State{Replica: id, Images: map[osimage.SHA256]Image{}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		_ = json.NewEncoder(w).Encode(p.state)
	}))
	t.Cleanup(srv.Close)
	p.Peer = Peer{ID: id, URL: srv.URL}
	return p
}

func (p *statePeer) set(sum osimage.SHA256, img Image) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state.Images[sum] = img
}

func TestAvailabilityAsPeersJoinAndLeave(t *testing.T) {
	img := newImage(t, 16, 7)
	sum := img.w.SHA256
	a, b := startStatePeer(t, "a"), startStatePeer(t, "b")
	a.set(sum, Image{Phase: imagelife.PhaseReady})
	rs := &replicas{self: "self", selfReady: true, ready: []Peer{a.Peer}}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	v := NewView(rs, nil, clk, ClaimRule{})
	ctx := context.Background()
	v.readAll(ctx)

	if !v.Available(sum, true, false) {
		t.Error("held here and by the one ready peer: not available")
	}
	if v.Available(sum, false, true) {
		t.Error("not held by this ready replica: available")
	}
	// b joins, ready, without the image; its state is not read yet.
	rs.mu.Lock()
	rs.ready = append(rs.ready, b.Peer)
	rs.mu.Unlock()
	clk.Step(time.Second)
	if !v.Available(sum, true, true) {
		t.Error("a peer joining, not read yet, took back an available image (the output would flap)")
	}
	if v.Available(sum, true, false) {
		t.Error("a peer joining, not read yet, made an image available")
	}
	clk.Step(time.Second)
	v.readAll(ctx)
	if v.Available(sum, true, true) {
		t.Error("a ready peer read without the image: still available")
	}
	b.set(sum, Image{Phase: imagelife.PhaseReady})
	v.readAll(ctx)
	if !v.Available(sum, true, false) {
		t.Error("every ready replica holds it: not available")
	}
	// a leaves.
	rs.mu.Lock()
	rs.ready = []Peer{b.Peer}
	rs.mu.Unlock()
	v.readAll(ctx)
	if !v.Available(sum, true, false) {
		t.Error("a peer leaving took the image away")
	}
	// Nobody ready (this replica not yet): nothing is available.
	rs.mu.Lock()
	rs.ready, rs.selfReady = nil, false
	rs.mu.Unlock()
	if v.Available(sum, true, true) {
		t.Error("no ready replica, yet available")
	}
}

func TestClaimsWaitForTheListedReplicasToSettle(t *testing.T) {
	a := startStatePeer(t, "a")
	rs := &replicas{self: "self", ready: []Peer{a.Peer}}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	v := NewView(rs, nil, clk, ClaimRule{})
	if v.Claimable() || v.Known() {
		t.Fatal("claimable before the peers were read")
	}
	v.readAll(context.Background())
	if v.Claimable() {
		t.Fatal("claimable at once after the list changed")
	}
	clk.Step(listedSettle)
	if !v.Claimable() {
		t.Fatal("not claimable once the list stayed the same")
	}
	b := startStatePeer(t, "b")
	rs.mu.Lock()
	rs.down = []Peer{b.Peer}
	rs.mu.Unlock()
	v.readAll(context.Background())
	if v.Claimable() {
		t.Fatal("claimable right after a replica was listed")
	}
}

func TestChooseVerifiedFirstThenThePullerThenTheRendezvous(t *testing.T) {
	img := newImage(t, 16, 8)
	sum := img.w.SHA256
	peers := map[string]*statePeer{}
	var listed []Peer
	for _, id := range []string{"a", "b", "c"} {
		peers[id] = startStatePeer(t, id)
		listed = append(listed, peers[id].Peer)
	}
	rs := &replicas{self: "self", ready: listed}
	v := NewView(rs, nil, nil, ClaimRule{})
	none := func(string) bool { return false }
	order := Rendezvous(string(sum), []string{"a", "b", "c", "self"})

	v.readAll(context.Background())
	got := v.Choose(sum, none)
	if order[0] == "self" && got != nil || order[0] != "self" && (got == nil || got.ID != order[0]) {
		t.Errorf("nobody holds it: chose %v, want the first of %v", got, order)
	}
	// Skipping every peer: the registry.
	if got := v.Choose(sum, func(string) bool { return true }); got != nil {
		t.Errorf("every peer skipped: chose %v, want the registry", got)
	}
	last := order[len(order)-1]
	if last == "self" {
		last = order[len(order)-2]
	}
	peers[last].set(sum, Image{Phase: imagelife.PhaseDownloading, Source: fill.FromRegistry})
	v.readAll(context.Background())
	if got := v.Choose(sum, none); got == nil || got.ID != last {
		t.Errorf("%s pulls it from the registry: chose %v", last, got)
	}
	holder := "b"
	if last == "b" {
		holder = "a"
	}
	peers[holder].set(sum, Image{Phase: imagelife.PhaseReady})
	v.readAll(context.Background())
	if got := v.Choose(sum, none); got == nil || got.ID != holder {
		t.Errorf("%s holds it verified: chose %v", holder, got)
	}
	if got := v.Choose(sum, func(id string) bool { return id == holder }); got == nil || got.ID != last {
		t.Errorf("the holder skipped: chose %v, want the puller %s", got, last)
	}
}
