package replica

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sylva-projects/osimages/internal/imagelife"
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

// DefaultClaimWait is how long after its first read of the peers a replica
// that lists fewer replicas than ClaimRule.Replicas (or, that number
// unknown, none but itself) waits before it claims a download anyway.
const DefaultClaimWait = 10 * time.Second

// ClaimRule says when a replica may claim its first downloads: once the
// replicas listed, itself included, are Replicas or more (0: unknown, then
// two or more) and stayed the same for listedSettle, or once Wait has
// passed since its first read of the peers.
//
// Replicas started together each list the others only once these have an
// address: a replica whose first listing is empty or partial would believe
// it is alone, or first in rendezvous order, and pull what another pulls
// too. The expected count, and the bounded wait for when it is wrong or
// unknown, let it wait for the others to show.
type ClaimRule struct {
	Replicas int
	Wait     time.Duration
}

// View is what a replica last read of its peers: their states, read
// every PollInterval (Poll), and the answers the server takes from them.
// It never calls the server while it holds its own lock, so the server
// may ask it under its own.
type View struct {
	replicas Replicas
	client   *http.Client
	log      *slog.Logger
	clock    clock.WithTicker
	rule     ClaimRule
	instance string

	mu    sync.Mutex
	peers map[string]peerView
	known bool
	// firstRead is when the peers were first read; listedIDs are the
	// replicas listed at the last read, changed at listedChangedAt (the
	// first read counts as a change); readySeen is when each ready peer
	// was first seen ready.
	firstRead       time.Time
	listedIDs       []string
	listedChangedAt time.Time
	readySeen       map[string]time.Time
	// toldWaiting: the wait for the replicas expected was logged.
	toldWaiting bool
}

// peerView is what was last learnt of a peer's state.
type peerView struct {
	state State
	err   error
	at    time.Time
}

// NewView reads the peers that replicas lists, and lets downloads be
// claimed under rule. A nil clock is the real one; a zero rule.Wait is
// DefaultClaimWait.
func NewView(replicas Replicas, log *slog.Logger, clk clock.WithTicker, rule ClaimRule) *View {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	if rule.Wait <= 0 {
		rule.Wait = DefaultClaimWait
	}
	return &View{replicas: replicas, log: log, clock: clk, rule: rule, instance: newInstance(),
		client: &http.Client{Transport: Transport(), Timeout: 5 * time.Second}}
}

// Self is this replica's ID.
func (v *View) Self() string { return v.replicas.Self() }

// Instance names this run of the replica (State.Instance): random, drawn
// when the View is made, once per process.
func (v *View) Instance() string { return v.instance }

func newInstance() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail
	return hex.EncodeToString(b)
}

// instanceOf is peer id's instance as its state was last read; false
// when that read failed, or the peer was not read.
func (v *View) instanceOf(id string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	pv, ok := v.peers[id]
	if !ok || pv.err != nil {
		return "", false
	}
	return pv.state.Instance, true
}

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

// readAll reads every listed peer's state once, and returns what it read
// (nil when ctx ended).
func (v *View) readAll(ctx context.Context) map[string]peerView {
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
		return nil
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
	now := v.clock.Now()
	if !v.known {
		// The first listing starts the settle, an empty one too: compared
		// with no listing at all it would not count as a change, and a
		// replica that listed nobody would claim at once.
		v.known, v.firstRead, v.listedIDs, v.listedChangedAt = true, now, ids, now
	}
	if !slices.Equal(ids, v.listedIDs) {
		v.listedIDs, v.listedChangedAt = ids, now
	}
	return views
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
// choose who pulls what; nor, until the claim rule's Wait has passed since
// the first read, while fewer replicas are listed than it expects.
func (v *View) Claimable() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.known || v.clock.Since(v.listedChangedAt) < listedSettle {
		return false
	}
	want := v.rule.Replicas
	if want <= 0 {
		// Unknown: a replica that lists no other waits.
		want = 2
	}
	if len(v.listedIDs)+1 >= want || v.clock.Since(v.firstRead) >= v.rule.Wait {
		return true
	}
	if !v.toldWaiting {
		// Once: the replicas settled, and too few of them for a claim.
		v.toldWaiting = true
		v.log.Info("no download is claimed until the replicas expected are listed, or the claim wait has passed",
			"listed", len(v.listedIDs)+1, "expected", want, "claimWait", v.rule.Wait)
	}
	return false
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

// FanOut is how many followers a replica feeds an image in progress at
// most, when every replica lists the same others (Tree).
const FanOut = 2

// Choose is where to fill sum from: a peer, or nil for the registry. A
// peer for which skip says true failed this image and is passed over.
func (v *View) Choose(sum osimage.SHA256, skip func(id string) bool) *Peer {
	listed := v.replicas.Listed()
	self := v.replicas.Self()
	v.mu.Lock()
	views := maps.Clone(v.peers)
	v.mu.Unlock()
	byID := map[string]Peer{}
	ids := []string{self}
	images := map[string]Image{}
	for _, p := range listed {
		if skip(p.ID) {
			continue
		}
		byID[p.ID] = p
		ids = append(ids, p.ID)
		if pv, ok := views[p.ID]; ok && pv.err == nil {
			images[p.ID] = pv.state.Images[sum]
		}
	}
	from := Tree(self, Rendezvous(string(sum), ids), images, FanOut)
	if from == self {
		return nil
	}
	p := byID[from]
	return &p
}

// Tree is where self fills an image from (self: the registry), given the
// rendezvous order of the replicas that may fill it (the ones that failed
// it left out) and the images of the peers whose state was read.
//
// The source comes first: a peer that holds the image verified (it costs
// the registry nothing), else one that pulls it from the registry already
// (it may have chosen itself before this replica was listed), else one
// that claims its pull (it goes ahead unless one pulls already:
// View.ConfirmClaim), else the first of the order, ready or not: readiness
// changes as replicas start and fill, and replicas that judged it at
// different moments would choose different pullers (a listed replica that
// is down refuses at once, and is skipped). The others follow in
// rendezvous order, each from the replica fanOut places up a tree rooted
// at the source: replica i (0 the source) follows replica (i-1)/fanOut,
// which streams what it receives as it receives it. So the source feeds
// fanOut followers, not every one, and each replica's NIC carries at most
// fanOut copies. Parents come before their children in the order, so no
// two replicas follow each other; one that failed is left out by the
// caller, which moves its children up the tree. A peer whose image failed
// (it cannot store it, say) is left out too: it would send nothing.
func Tree(self string, order []string, images map[string]Image, fanOut int) string {
	order = slices.DeleteFunc(slices.Clone(order), func(id string) bool {
		img := images[id]
		return id != self && img.Phase == imagelife.PhaseFailed && !img.Verified()
	})
	root := ""
	for _, has := range []func(Image) bool{Image.Verified, Image.PullsFromRegistry, Image.ClaimsRegistry} {
		for _, id := range order {
			if img, ok := images[id]; ok && id != self && has(img) {
				root = id
				break
			}
		}
		if root != "" {
			break
		}
	}
	if root == "" && len(order) > 0 {
		root = order[0]
	}
	if root == self || root == "" {
		return self
	}
	tree := append([]string{root}, slices.DeleteFunc(order, func(id string) bool { return id == root })...)
	i := slices.Index(tree, self)
	if i <= 0 {
		return root
	}
	return tree[(i-1)/max(fanOut, 1)]
}

// Verdict is what a replica that claimed the registry pull of an image
// learns from its peers' states (ConfirmClaim).
type Verdict int

const (
	// Proceed: no peer holds the image, pulls it, or claims it and ranks
	// before this replica.
	Proceed Verdict = iota
	// GiveWay: a peer holds it, pulls it, or claims it and ranks before
	// this replica: fill from it (Choose).
	GiveWay
	// Hold: a peer that ranks after this replica claims it too, and may
	// not have seen this claim: read again until it gives way or pulls.
	Hold
)

// ConfirmClaim reads every listed peer's state, once this replica
// announces that it pulls sum from the registry (its state says so:
// Image.ClaimsRegistry), and judges the claim, naming the peer it gives
// way to or holds for. Two replicas that claim the same image each read
// the other after their own announcement, so at least the later one sees
// the earlier, as long as each lists the other: that one gives way when the other ranks first in
// rendezvous order or already pulls, and holds while the other may still
// give way to it. Only replicas that rank after it are held for, so no two
// hold for each other. Peers for which skip says true, and peers whose
// state cannot be read, are left out: they count as holding nothing.
func (v *View) ConfirmClaim(ctx context.Context, sum osimage.SHA256, skip func(id string) bool) (Verdict, string) {
	views := v.readAll(ctx)
	self := v.replicas.Self()
	ids := []string{self}
	images := map[string]Image{}
	for id, pv := range views {
		if skip(id) || pv.err != nil {
			continue
		}
		ids = append(ids, id)
		images[id] = pv.state.Images[sum]
	}
	return judgeClaim(self, Rendezvous(string(sum), ids), images)
}

// judgeClaim judges self's claim of an image over the rendezvous order of
// the replicas, from the peers' images.
func judgeClaim(self string, order []string, images map[string]Image) (Verdict, string) {
	verdict, peer := Proceed, ""
	before := true
	for _, id := range order {
		if id == self {
			before = false
			continue
		}
		img, ok := images[id]
		switch {
		case !ok:
		case img.Verified() || img.PullsFromRegistry() || img.ClaimsRegistry() && before:
			return GiveWay, id
		case img.ClaimsRegistry() && verdict == Proceed:
			verdict, peer = Hold, id
		}
	}
	return verdict, peer
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
