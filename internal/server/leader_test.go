package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// oneReadyPeer is the Service of a replica that is not ready yet, beside
// one ready peer.
type oneReadyPeer struct{ peer replica.Peer }

func (r oneReadyPeer) Self() string           { return "starting" }
func (r oneReadyPeer) Ready() []replica.Peer  { return []replica.Peer{r.peer} }
func (r oneReadyPeer) Listed() []replica.Peer { return []replica.Peer{r.peer} }
func (r oneReadyPeer) SelfReady() bool        { return false }
func (r oneReadyPeer) Synced() bool           { return true }

// recordingPublisher keeps every served set published, and answers
// Published with what a previous leader left.
type recordingPublisher struct {
	mu        sync.Mutex
	sets      []osimage.ServedSet
	last      osimage.ServedOutput
	previous  osimage.ServedSet
	readCalls int
}

// output is the last output published.
func (p *recordingPublisher) output() osimage.ServedOutput {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

func (p *recordingPublisher) Publish(_ context.Context, out osimage.ServedOutput) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sets = append(p.sets, out.Set)
	p.last = out
	return nil
}

func (p *recordingPublisher) Published(context.Context) (osimage.ServedSet, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readCalls++
	return p.previous, nil
}

func (p *recordingPublisher) published() []osimage.ServedSet {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]osimage.ServedSet(nil), p.sets...)
}

// peerState serves /peer/state as a peer that holds sum verified, once
// open is closed; until then every read hangs (a peer slow to answer, or
// this replica's first poll still in flight). With fail, every read
// answers 500.
func peerState(t *testing.T, sum osimage.SHA256, open <-chan struct{}, fail bool) replica.Peer {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		select {
		case <-open:
		case <-r.Context().Done():
			return
		}
		_ = json.NewEncoder(w).Encode(replica.State{Replica: "peer", Images: map[osimage.SHA256]replica.Image{sum: {Phase: imagelife.PhaseReady}}})
	}))
	t.Cleanup(srv.Close)
	return replica.Peer{ID: "peer", URL: srv.URL}
}

// A replica that leads as soon as it starts (the Lease released by the
// one it replaces, in a rolling update) must not publish before it has
// read its peers' states: it would say "not available" of every image its
// ready peers hold, a flap that fails renders (seen in the end-to-end
// Operations scenario).
func TestANewLeaderPublishesOnlyOnceItReadItsPeers(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("image a"), true)
	open := make(chan struct{})
	peer := peerState(t, a.SHA256, open, false)
	pub := &recordingPublisher{}
	h := start(t, t.TempDir(), src, func(c *Config) {
		c.Replicas = oneReadyPeer{peer: peer}
		c.Publisher = pub
	})
	h.srv.SetLeader(true)
	h.want(a)

	// The publish loop has passed its decision with the image selected
	// and the peer's state unread (its read hangs until open): nothing
	// counted, nothing published.
	h.passPublishLoop()
	for _, set := range pub.published() {
		if !set[a.SHA256].Available {
			t.Fatalf("published %v before the peers' states were read: the peer holds the image verified", set)
		}
	}
	close(open)
	testenv.Poll(t, "the image published available, as the ready peer holds it", 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		sets := pub.published()
		return len(sets) > 0 && sets[len(sets)-1][a.SHA256].Available, ""
	})
	for _, set := range pub.published() {
		if !set[a.SHA256].Available {
			t.Errorf("published %v: a flap", set)
		}
	}
}

// A replica that leads before it ever counted inherits what its
// predecessor published: a ready peer whose state cannot be read does not
// take back an image the fleet was told is available, as it would not
// have had this replica counted it before.
func TestANewLeaderKeepsWhatItsPredecessorPublished(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("image a"), true)
	peer := peerState(t, a.SHA256, nil, true)
	pub := &recordingPublisher{previous: osimage.ServedSet{a.SHA256: {Available: true, ImageKey: "ubuntu-a"}}}
	h := start(t, t.TempDir(), src, func(c *Config) {
		c.Replicas = oneReadyPeer{peer: peer}
		c.Publisher = pub
	})
	h.srv.SetLeader(true)
	h.want(a)
	testenv.Poll(t, "a first publication", 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		return len(pub.published()) > 0, ""
	})
	for _, set := range pub.published() {
		if !set[a.SHA256].Available {
			t.Errorf("published %v: the previous leader published the image available, and the only ready peer's state cannot be read", set)
		}
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if pub.readCalls != 1 {
		t.Errorf("the previous output was read %d times, want once", pub.readCalls)
	}
}

// passPublishLoop returns once the publish loop has run a whole pass that
// began after the call, so that what it decides on the state as it is now
// has been decided. The loop's signal is buffered by one: the second send
// waits for the loop to take the first, which starts that pass, and the
// third for it to take the second, which it does only once that pass is
// over.
func (h *harness) passPublishLoop() {
	h.t.Helper()
	for range 3 {
		select {
		case h.srv.changed <- struct{}{}:
		case <-time.After(time.Minute):
			h.t.Fatal("the publish loop took no signal for a minute")
		}
	}
}
