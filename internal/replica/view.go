package replica

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Replicas is what a replica knows of the replicas of its Service
// (Tracker is one).
type Replicas interface {
	// Self is this replica's ID.
	Self() string
	// Ready are the other ready replicas.
	Ready() []Peer
	// Listed are the other replicas listed, ready or not.
	Listed() []Peer
	// SelfReady says whether this replica is a ready endpoint.
	SelfReady() bool
	// Synced is false until the endpoints were listed once.
	Synced() bool
}

// PollInterval is how often a replica reads its peers' states. The
// leader learns that a peer verified an image from this poll, so its
// period adds to the time from selection to available: true; the state
// is a small JSON document per peer.
const PollInterval = 250 * time.Millisecond

// listedSettle is how long the replicas listed must stay the same before
// a download is claimed: two rounds of reading the peers.
const listedSettle = 2 * PollInterval

// View is what a replica last read of its peers: their states, read
// every PollInterval (Poll), and the answers the server takes from them.
// It never calls the server while it holds its own lock, so the server
// may ask it under its own.
type View struct {
	replicas Replicas
	client   *http.Client
	log      *slog.Logger
	clock    clock.WithTicker

	mu    sync.Mutex
	peers map[string]peerView
	known bool
	// listedIDs are the replicas listed at the last read, changed at
	// listedChangedAt; readySeen is when each ready peer was first seen
	// ready.
	listedIDs       []string
	listedChangedAt time.Time
	readySeen       map[string]time.Time
}

// peerView is what was last learnt of a peer's state.
type peerView struct {
	state State
	err   error
	at    time.Time
}

// NewView reads the peers that replicas lists. A nil clock is the real
// one.
func NewView(replicas Replicas, log *slog.Logger, clk clock.WithTicker) *View {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &View{replicas: replicas, log: log, clock: clk,
		client: &http.Client{Transport: Transport(), Timeout: 5 * time.Second}}
}

// Self is this replica's ID.
func (v *View) Self() string { return v.replicas.Self() }

// Poll reads the state of every peer listed, ready or not, every
// PollInterval and whenever changed fires, until ctx ends; read is called
// after each round.
func (v *View) Poll(ctx context.Context, changed <-chan struct{}, read func()) {
	tick := v.clock.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		if v.replicas.Synced() {
			v.readAll(ctx)
			if ctx.Err() != nil {
				return
			}
			read()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		case <-changed:
		}
	}
}

// readAll reads every listed peer's state once.
func (v *View) readAll(ctx context.Context) {
	listed := v.replicas.Listed()
	views := map[string]peerView{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range listed {
		wg.Go(func() {
			st, err := FetchState(ctx, v.client, p)
			mu.Lock()
			views[p.ID] = peerView{state: st, err: err, at: v.clock.Now()}
			mu.Unlock()
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	ids := make([]string, 0, len(listed))
	for _, p := range listed {
		ids = append(ids, p.ID)
	}
	slices.Sort(ids)
	v.mu.Lock()
	defer v.mu.Unlock()
	for id, pv := range views {
		if old, ok := v.peers[id]; pv.err != nil && (!ok || old.err == nil) {
			v.log.Warn("a peer's state cannot be read: it counts as holding nothing", "peer", id, "error", pv.err.Error())
		}
	}
	v.peers = views
	v.known = true
	if !slices.Equal(ids, v.listedIDs) {
		v.listedIDs, v.listedChangedAt = ids, v.clock.Now()
	}
}

// Known says whether the peers' states were read once.
func (v *View) Known() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.known
}

// Claimable: nothing is claimed until the endpoints and the peers' states
// are known, or every replica would pull everything from the registry at
// start; nor while the replicas listed changed less than listedSettle
// ago, so that replicas started together list each other before they
// choose who pulls what.
func (v *View) Claimable() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.known && v.clock.Since(v.listedChangedAt) >= listedSettle
}

// Available says whether sum is available: every ready replica holds it
// verified, this one (held) included when it is ready.
//
// A ready peer whose state could not be read, or was read before it became
// ready, holds nothing new: it makes no image available. But it cannot
// take back one that was available at the last count (wasAvailable):
// a replica becomes ready only once it holds every image its ready peers
// hold (HeldByReadyPeer), and a peer's state goes unread when it stops,
// before its endpoint goes; the output would flap at each scale-down and
// each new replica.
func (v *View) Available(sum osimage.SHA256, held, wasAvailable bool) bool {
	counted := 0
	if v.replicas.SelfReady() {
		if !held {
			return false
		}
		counted++
	}
	ready := v.replicas.Ready()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.noteReadyLocked(ready)
	for _, p := range ready {
		pv, ok := v.peers[p.ID]
		if ok && pv.err == nil && pv.state.Images[sum].Verified() {
			counted++
			continue
		}
		if (!ok || pv.err != nil || pv.at.Before(v.readySeen[p.ID])) && wasAvailable {
			counted++
			continue
		}
		return false
	}
	return counted > 0
}

// noteReadyLocked records when each ready peer was first seen ready.
func (v *View) noteReadyLocked(ready []Peer) {
	if v.readySeen == nil {
		v.readySeen = map[string]time.Time{}
	}
	now := v.clock.Now()
	ids := map[string]bool{}
	for _, p := range ready {
		ids[p.ID] = true
		if _, seen := v.readySeen[p.ID]; !seen {
			v.readySeen[p.ID] = now
		}
	}
	for id := range v.readySeen {
		if !ids[id] {
			delete(v.readySeen, id)
		}
	}
}

// HeldByReadyPeer says whether a ready peer holds sum verified: a replica
// that does not is not ready yet (it fills from its peers meanwhile), so
// that any replica can answer any URL published as available.
func (v *View) HeldByReadyPeer(sum osimage.SHA256) bool {
	ready := v.replicas.Ready()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, p := range ready {
		if pv := v.peers[p.ID]; pv.err == nil && pv.state.Images[sum].Verified() {
			return true
		}
	}
	return false
}

// Choose is where to fill sum from: a peer, or nil for the registry. A
// peer for which skip says true failed this image and is passed over.
func (v *View) Choose(sum osimage.SHA256, skip func(id string) bool) *Peer {
	listed := v.replicas.Listed()
	self := v.replicas.Self()
	v.mu.Lock()
	views := maps.Clone(v.peers)
	v.mu.Unlock()
	byID := map[string]Peer{}
	ids := []string{}
	for _, p := range listed {
		byID[p.ID] = p
		ids = append(ids, p.ID)
	}
	usable := func(id string) bool { return !skip(id) && views[id].err == nil }
	order := Rendezvous(string(sum), ids)
	// A verified copy first: it costs the registry nothing.
	for _, id := range order {
		if usable(id) && views[id].state.Images[sum].Verified() {
			p := byID[id]
			return &p
		}
	}
	// Then a peer that pulls it from the registry already: it may have
	// chosen itself before this replica was listed.
	for _, id := range order {
		if usable(id) && views[id].state.Images[sum].PullsFromRegistry() {
			p := byID[id]
			return &p
		}
	}
	// Else the first of the rendezvous order pulls from the registry, and
	// the others stream its download. The order is over every replica
	// listed and not terminating, ready or not: readiness changes as
	// replicas start and fill, and replicas that judged it at different
	// moments would choose different pullers. A listed replica that is
	// down fails at once (its port refuses) and is skipped.
	for _, id := range Rendezvous(string(sum), append(ids, self)) {
		if id == self {
			return nil
		}
		if !skip(id) {
			p := byID[id]
			return &p
		}
	}
	return nil
}

// States are the peers' states as last read, by ID, for the status page;
// a peer whose state could not be read holds no image.
func (v *View) States() []State {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]State, 0, len(v.peers))
	for _, id := range slices.Sorted(maps.Keys(v.peers)) {
		pv := v.peers[id]
		st := pv.state
		st.Replica = id
		if pv.err != nil {
			st.Images = nil
		}
		out = append(out, st)
	}
	return out
}
