package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/peers"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/selection"
)

// Replicas: several servers behind one Service fill from each other. Each
// keeps its own verified copy. For each image, one replica (the first of
// the rendezvous order of its sha256 over the ready replicas) pulls it
// from the registry; the others stream that download from its peer
// listener while it is in progress, or copy a peer's verified copy, and
// verify every byte themselves as they would a registry pull. A peer that
// fails or sends bad bytes is reported and skipped for that image, and the
// next in the order takes over. One replica, the leader, publishes; an
// image is available once every ready replica holds it verified.

// Replicas is what the server knows of the replicas of its Service
// (peers.Tracker is one).
type Replicas interface {
	// Self is this replica's ID.
	Self() string
	// Ready are the other ready replicas.
	Ready() []peers.Peer
	// Listed are the other replicas listed, ready or not.
	Listed() []peers.Peer
	// SelfReady says whether this replica is a ready endpoint.
	SelfReady() bool
	// Synced is false until the endpoints were listed once.
	Synced() bool
}

// PeerReporter reports a peer that failed or sent bad bytes, beside the
// log line and the metric (a Kubernetes event, say).
type PeerReporter func(peer, sha256, reason string)

// The fill sources an image's state names.
const (
	SourceRegistry = "registry"
	SourceStore    = "store" // found verified on disk at start
	sourcePeer     = "peer "
)

// DefaultPeerTimeout is how long a peer may show no progress before the
// next replica in the rendezvous order takes over.
const DefaultPeerTimeout = 30 * time.Second

// ReplicaState is one replica's images, as its peer state endpoint
// (/peer/state) answers it.
type ReplicaState struct {
	Replica string                  `json:"replica"`
	Images  map[string]ReplicaImage `json:"images"`
}

// ReplicaImage is one image on one replica.
type ReplicaImage struct {
	Phase Phase `json:"phase"`
	// Source is where the copy comes (or came) from: "registry", "peer
	// <id>", or "store" for a copy found on disk at start.
	Source     string    `json:"source,omitempty"`
	Received   int64     `json:"received,omitempty"`
	Size       int64     `json:"size,omitempty"`
	VerifiedAt time.Time `json:"verifiedAt,omitzero"`
}

// Verified says whether the replica holds a verified copy.
func (i ReplicaImage) Verified() bool { return i.Phase == PhaseReady }

// peerView is what was last learnt of a peer's state.
type peerView struct {
	state ReplicaState
	err   error
	at    time.Time
}

// replicaState is this replica's state, as peers read it.
func (s *Server) replicaState() ReplicaState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replicaStateLocked()
}

func (s *Server) replicaStateLocked() ReplicaState {
	out := ReplicaState{Replica: s.cfg.Replicas.Self(), Images: map[string]ReplicaImage{}}
	for sum, img := range s.images {
		ri := ReplicaImage{Phase: img.phase, Source: img.source, Received: img.received}
		if img.stored {
			ri.Phase, ri.Size, ri.VerifiedAt = PhaseReady, img.entry.Size, img.entry.VerifiedAt
		}
		out.Images[sum] = ri
	}
	return out
}

// peerPollInterval is how often a replica reads its peers' states. The
// leader learns that a peer verified an image from this poll, so its
// period adds to the time from selection to available: true; the state
// is a small JSON document per peer.
const peerPollInterval = 250 * time.Millisecond

// pollPeers reads the state of every peer listed, ready or not, every
// peerPollInterval, until ctx ends.
func (s *Server) pollPeers(ctx context.Context, changed <-chan struct{}) {
	client := &http.Client{Transport: peerTransport(), Timeout: 5 * time.Second}
	tick := time.NewTicker(peerPollInterval)
	defer tick.Stop()
	for {
		if s.cfg.Replicas.Synced() {
			listed := s.cfg.Replicas.Listed()
			views := map[string]peerView{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for _, p := range listed {
				wg.Go(func() {
					st, err := fetchState(ctx, client, p)
					mu.Lock()
					views[p.ID] = peerView{state: st, err: err, at: time.Now()}
					mu.Unlock()
				})
			}
			wg.Wait()
			if ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			for id, v := range views {
				if old, ok := s.peerViews[id]; v.err != nil && (!ok || old.err == nil) {
					s.log.Warn("a peer's state cannot be read: it counts as holding nothing", "peer", id, "error", v.err.Error())
				}
			}
			s.peerViews = views
			s.peersKnown = true
			ids := make([]string, 0, len(listed))
			for _, p := range listed {
				ids = append(ids, p.ID)
			}
			slices.Sort(ids)
			if !slices.Equal(ids, s.listedIDs) {
				s.listedIDs, s.listedChangedAt = ids, time.Now()
			}
			s.mu.Unlock()
			s.signal(s.changed)
			s.signal(s.kick)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changed:
		}
	}
}

func fetchState(ctx context.Context, client *http.Client, p peers.Peer) (ReplicaState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/peer/state", nil)
	if err != nil {
		return ReplicaState{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return ReplicaState{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ReplicaState{}, fmt.Errorf("%s/peer/state: %s", p.URL, resp.Status)
	}
	var st ReplicaState
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&st); err != nil {
		return ReplicaState{}, fmt.Errorf("%s/peer/state: %w", p.URL, err)
	}
	if st.Replica != p.ID {
		return ReplicaState{}, fmt.Errorf("%s/peer/state answers as replica %q, not %q", p.URL, st.Replica, p.ID)
	}
	return st, nil
}

// peerTransport reaches peers directly: they are pods of the same
// namespace, never behind the registry's proxy.
func peerTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return t
}

// availableLocked: sum is available once every ready replica (this one
// included when it is ready) holds it verified.
//
// A ready peer whose state could not be read, or was read before it became
// ready, holds nothing new: it makes no image available. But it cannot
// take back one that is available either: a replica becomes ready only
// once it holds every image its ready peers hold (ReplicaReady), and a
// peer's state goes unread when it stops, before its endpoint goes; the
// output would flap at each scale-down and each new replica.
func (s *Server) availableLocked(sum string, img *image) bool {
	if s.cfg.Replicas == nil {
		return img.phase == PhaseReady && img.stored
	}
	counted := 0
	if s.cfg.Replicas.SelfReady() {
		if !(img.phase == PhaseReady && img.stored) {
			return false
		}
		counted++
	}
	ready := s.cfg.Replicas.Ready()
	s.noteReadyLocked(ready)
	for _, p := range ready {
		v, ok := s.peerViews[p.ID]
		if ok && v.err == nil && v.state.Images[sum].Verified() {
			counted++
			continue
		}
		if (!ok || v.err != nil || v.at.Before(s.readySeen[p.ID])) && s.lastAvailable[sum] {
			counted++
			continue
		}
		return false
	}
	return counted > 0
}

// noteReadyLocked records when each ready peer was first seen ready.
func (s *Server) noteReadyLocked(ready []peers.Peer) {
	if s.readySeen == nil {
		s.readySeen = map[string]time.Time{}
	}
	now := time.Now()
	ids := map[string]bool{}
	for _, p := range ready {
		ids[p.ID] = true
		if _, seen := s.readySeen[p.ID]; !seen {
			s.readySeen[p.ID] = now
		}
	}
	for id := range s.readySeen {
		if !ids[id] {
			delete(s.readySeen, id)
		}
	}
}

// SetLeader says whether this replica publishes (it holds the Lease).
// Becoming leader publishes at once, whatever another leader wrote.
func (s *Server) SetLeader(leader bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leader = leader
	s.published = osimage.ServedOutput{}
	if leader {
		s.log.Info("this replica leads: it publishes the served set", "replica", s.cfg.Replicas.Self())
	} else {
		s.log.Info("this replica does not lead: another publishes the served set", "replica", s.cfg.Replicas.Self())
	}
	s.signal(s.changed)
}

func (s *Server) isLeader() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Replicas != nil && s.leader
}

func (s *Server) publishesLocked() bool { return s.cfg.Replicas == nil || s.leader }

// claimableLocked: with replicas, nothing is claimed until the endpoints
// and the peers' states are known, or every replica would pull everything
// from the registry at start; nor while the replicas listed changed less
// than listedSettle ago, so that replicas started together list each
// other before they choose who pulls what.
func (s *Server) claimableLocked() bool {
	return s.cfg.Replicas == nil || s.peersKnown && time.Since(s.listedChangedAt) >= listedSettle
}

// listedSettle is how long the replicas listed must stay the same before
// a download is claimed: two rounds of reading the peers.
const listedSettle = 2 * peerPollInterval

// ReplicaReady is the readiness of a replica: until it holds every
// selected image a ready peer holds verified, it stays out of the Service
// (it fills from its peers meanwhile), so that any replica can answer any
// URL published as available. Once ready it stays so. Without replicas it
// is always true.
func (s *Server) ReplicaReady() (bool, string) {
	if s.cfg.Replicas == nil {
		return true, ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readyOnce {
		return true, ""
	}
	if s.phaseLocked() == ServerStarting || !s.peersKnown {
		return false, "the inputs and the peers are being read"
	}
	var missing []string
	ready := s.cfg.Replicas.Ready()
	for sum, img := range s.images {
		if !img.selected || img.stored {
			continue
		}
		for _, p := range ready {
			if v := s.peerViews[p.ID]; v.err == nil && v.state.Images[sum].Verified() {
				missing = append(missing, sum)
				break
			}
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return false, fmt.Sprintf("filling %d images that peers serve: %s", len(missing), strings.Join(missing, ", "))
	}
	s.readyOnce = true
	return true, ""
}

// chooseSource is where to fill an image from: a peer, or the registry
// (nil).
func (s *Server) chooseSource(sum string) *peers.Peer {
	listed := s.cfg.Replicas.Listed()
	self := s.cfg.Replicas.Self()
	s.mu.Lock()
	bad := maps.Clone(s.images[sum].badPeers)
	views := s.peerViews
	s.mu.Unlock()
	byID := map[string]peers.Peer{}
	ids := []string{}
	for _, p := range listed {
		byID[p.ID] = p
		ids = append(ids, p.ID)
	}
	// A verified copy first: it costs the registry nothing.
	for _, id := range peers.Rendezvous(sum, ids) {
		if _, isBad := bad[id]; !isBad && views[id].err == nil && views[id].state.Images[sum].Verified() {
			p := byID[id]
			return &p
		}
	}
	// Then a peer that pulls it from the registry already: it may have
	// chosen itself before this replica was listed.
	for _, id := range peers.Rendezvous(sum, ids) {
		img := views[id].state.Images[sum]
		if _, isBad := bad[id]; !isBad && views[id].err == nil && img.Source == SourceRegistry &&
			(img.Phase == PhaseDownloading || img.Phase == PhaseVerifying) {
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
	ids = append(ids, self)
	for _, id := range peers.Rendezvous(sum, ids) {
		if id == self {
			return nil
		}
		if _, isBad := bad[id]; !isBad {
			p := byID[id]
			return &p
		}
	}
	return nil
}

// fill pulls w into dst from a peer or the registry, and says which.
func (s *Server) fill(ctx context.Context, w selection.Wanted, dst *imagestore.Writer, progress func(int64, int64)) (pull.Result, string, error) {
	if s.cfg.Replicas == nil {
		res, err := s.cfg.Pull(ctx, w, dst, progress)
		return res, SourceRegistry, err
	}
	for {
		peer := s.chooseSource(w.SHA256)
		if peer == nil {
			s.setSource(w.SHA256, SourceRegistry)
			// Followers stream the compressed layer as it arrives rather
			// than the image: a fraction of the bytes over this NIC.
			dst.KeepBlob()
			res, err := s.cfg.Pull(ctx, w, dst, progress)
			return res, SourceRegistry, err
		}
		s.setSource(w.SHA256, sourcePeer+peer.ID)
		res, err := s.pullFromPeer(ctx, *peer, w, dst, progress)
		if errors.Is(err, errPeerCommitted) {
			// Its layer is gone with the commit, not its image: copy that.
			s.log.Info("peer committed the image while its compressed layer was streamed; copying the image from it", "peer", peer.ID, "sha256", w.SHA256, "key", w.Key)
			if err := dst.Reset(); err != nil {
				return pull.Result{}, "", err
			}
			progress(0, 0)
			res, err = s.pullFromPeer(ctx, *peer, w, dst, progress)
		}
		if err == nil {
			return res, sourcePeer + peer.ID, nil
		}
		if ctx.Err() != nil {
			return res, "", err
		}
		s.reportPeer(w, *peer, err)
		if err := dst.Reset(); err != nil {
			return pull.Result{}, "", err
		}
		progress(0, 0)
	}
}

func (s *Server) setSource(sum, source string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if img, ok := s.images[sum]; ok {
		img.source = source
	}
}

// pullFromPeer streams w from a peer's peer listener, verified as a
// registry pull is (sha256, md5, size), resumed with ranges. No progress
// for PeerTimeout ends it, and so does a rate below MinRate over a
// StallTimeout window from the first byte, whether or not an image waits
// for a slot: a peer that trickles would hold the fill for ever, and the
// registry, or another peer, is there to take over.
func (s *Server) pullFromPeer(ctx context.Context, p peers.Peer, w selection.Wanted, dst *imagestore.Writer, progress func(int64, int64)) (pull.Result, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var mu sync.Mutex
	last, lastAt := int64(-1), time.Now()
	window := s.cfg.StallTimeout
	watch := time.NewTicker(min(max(s.cfg.PeerTimeout/4, 10*time.Millisecond), rateTick(window)))
	defer watch.Stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		var rate *rateWindow
		for {
			select {
			case <-done:
				return
			case <-watch.C:
				now := time.Now()
				mu.Lock()
				idle, received := now.Sub(lastAt), last
				mu.Unlock()
				if idle > s.cfg.PeerTimeout {
					cancel(fmt.Errorf("peer %s sent no byte for %s", p.ID, s.cfg.PeerTimeout))
					return
				}
				if received < 0 {
					continue // no byte yet: PeerTimeout's to judge
				}
				if rate == nil {
					rate = newRateWindow(window, now, received)
					continue
				}
				if slow, got, over := rate.below(now, received, s.cfg.MinRate); slow {
					cancel(&peerSlowError{peer: p.ID, received: got, window: over, minRate: s.cfg.MinRate})
					return
				}
			}
		}
	}()
	src := pull.Source{
		URI:    p.URL + osimage.ImagePath(osimage.SHA256(w.SHA256), w.Filename()),
		SHA256: w.SHA256, MD5: w.Image.Get(osimage.FieldMD5), Size: w.Int64Field(osimage.FieldSize),
	}
	if w.Image.Get(osimage.FieldCompression) != "" {
		// A peer pulling the image from the registry keeps its compressed
		// layer: stream that, verified as a registry blob is. Without one
		// (the peer holds the image verified already), copy the image.
		blob, kept, err := s.peerBlobDescriptor(ctx, p, w.SHA256)
		if err != nil {
			return pull.Result{}, err
		}
		if kept {
			src.URI = p.URL + peerBlobPath(w.SHA256)
			src.Compression = w.Image.Get(osimage.FieldCompression)
			src.BlobDigest, src.ArchiveSize = blob.Digest, blob.Size
		}
	}
	res, err := s.peerPuller.Pull(ctx, src, dst, func(received, total int64) {
		mu.Lock()
		if received > last {
			last, lastAt = received, time.Now()
		}
		mu.Unlock()
		progress(received, total)
	})
	// Bytes that did not verify are the peer's fault, whatever it holds
	// now: only a stream cut short is taken up again from its image.
	if err != nil && ctx.Err() == nil && !isVerifyError(err) && src.BlobDigest != "" && s.peerCommitted(ctx, p, w.SHA256) {
		return res, fmt.Errorf("%w: %w", errPeerCommitted, err)
	}
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = fmt.Errorf("%w: %w", cause, err)
	}
	return res, err
}

// errPeerCommitted says that a peer whose compressed layer was streamed
// committed the image meanwhile: the layer is gone (a resume of it fails),
// the image is there to copy.
var errPeerCommitted = errors.New("the peer committed the image and removed its compressed layer")

// peerCommitted says whether p keeps no compressed layer of sum any more
// and holds the image verified.
func (s *Server) peerCommitted(ctx context.Context, p peers.Peer, sum string) bool {
	if _, kept, err := s.peerBlobDescriptor(ctx, p, sum); err != nil || kept {
		return false
	}
	st, err := fetchState(ctx, s.peerPuller.HTTP, p)
	return err == nil && st.Images[sum].Verified()
}

// peerSlowError ends a fill from a peer that sends below MinRate.
type peerSlowError struct {
	peer     string
	received int64
	window   time.Duration
	minRate  int64
}

func (e *peerSlowError) Error() string {
	return fmt.Sprintf("peer %s sent %s in the last %s, below --min-rate %s/s", e.peer, bytesIEC(e.received), e.window.Round(time.Millisecond), bytesIEC(e.minRate))
}

// reportPeer logs, counts and reports a peer that failed to fill an
// image, and skips it for that image.
func (s *Server) reportPeer(w selection.Wanted, p peers.Peer, err error) {
	reason := "failed"
	var slow *peerSlowError
	switch {
	case isVerifyError(err):
		reason = "bad-bytes"
	case errors.As(err, &slow):
		reason = "slow"
	}
	s.mu.Lock()
	if img, ok := s.images[w.SHA256]; ok {
		if img.badPeers == nil {
			img.badPeers = map[string]time.Time{}
		}
		img.badPeers[p.ID] = time.Now()
	}
	s.mu.Unlock()
	s.log.Warn("peer failed to fill an image; filling it from elsewhere", "peer", p.ID, "url", p.URL, "sha256", w.SHA256, "key", w.Key, "reason", reason, "error", err.Error())
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.peerFailures.WithLabelValues(p.ID, reason).Inc()
	}
	if s.cfg.ReportPeer != nil {
		s.cfg.ReportPeer(p.ID, w.SHA256, fmt.Sprintf("%s: %v", reason, err))
	}
}

// PeerHandler serves the peer-only listener (--peer-listen): the images,
// verified or, while they are pulled from the registry, in progress, and
// the replica's state. Clients never reach it: only the headless Service
// names its port, and bytes in progress are unverified.
func (s *Server) PeerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /images/{sha256}/{file}", s.servePeer)
	mux.HandleFunc("GET /peer/blobs/{sha256}", s.servePeerBlob)
	mux.HandleFunc("GET /peer/blobs/{sha256}/descriptor", s.servePeerBlobDescriptor)
	mux.HandleFunc("GET /peer/state", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.replicaState())
	})
	return s.sendDeadline(mux)
}

// PeerHTTPServer is an http.Server for PeerHandler.
func (s *Server) PeerHTTPServer() *http.Server {
	return &http.Server{Handler: s.PeerHandler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, ConnContext: ConnContext}
}

func (s *Server) servePeer(w http.ResponseWriter, r *http.Request) {
	req, ok := osimage.ParseImagePath(r.URL.EscapedPath())
	if !ok || req.Checksum != "" {
		http.NotFound(w, r)
		return
	}
	sum := string(req.SHA256)
	// Wait for the download to start, or to be verified: a follower asks
	// as soon as it knows this replica pulls the image, which may be
	// before this replica has read the selection that names it (replicas
	// read it each at its own pace).
	deadline := time.Now().Add(s.cfg.PeerTimeout)
	for {
		s.mu.Lock()
		img, known := s.images[sum]
		var stored bool
		var writer *imagestore.Writer
		var size int64
		if known {
			stored = img.stored && img.phase == PhaseReady
			if img.source == SourceRegistry && img.phase == PhaseDownloading {
				writer = img.writer
			}
			size = img.Int64Field(osimage.FieldSize)
			if !slices.Contains(img.ServedAs(), req.Name()) && !(stored && img.entry.Filename == req.Name()) {
				known = false
			}
		}
		s.mu.Unlock()
		switch {
		case stored:
			s.serveStored(w, r, sum)
			return
		case writer != nil && size > 0:
			s.serveInProgress(w, r, writer.Tail, size)
			return
		}
		if time.Now().After(deadline) {
			if !known {
				http.Error(w, "this replica does not serve that image", http.StatusNotFound)
				return
			}
			w.Header().Set("Retry-After", "1")
			http.Error(w, "this replica is not pulling the image from the registry", http.StatusServiceUnavailable)
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serveInProgress streams the download in progress: one range (bytes=N-
// or bytes=N-M) or the whole, with the declared size as length. A download
// abandoned or started again cuts the connection: the follower's
// verification would refuse the bytes anyway.
func (s *Server) serveInProgress(w http.ResponseWriter, r *http.Request, open func(context.Context, int64) (io.ReadCloser, error), size int64) {
	from, to := int64(0), size-1
	status := http.StatusOK
	if h := r.Header.Get("Range"); h != "" {
		spec, ok := strings.CutPrefix(h, "bytes=")
		a, b, ok2 := strings.Cut(spec, "-")
		n, err := strconv.ParseInt(a, 10, 64)
		if !ok || !ok2 || err != nil || n < 0 || n >= size {
			w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
			http.Error(w, "requested range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		from = n
		if b != "" {
			m, err := strconv.ParseInt(b, 10, 64)
			if err != nil || m < from {
				http.Error(w, "requested range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
				return
			}
			to = min(m, size-1)
		}
		status = http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, to, size))
	}
	tail, err := open(r.Context(), from)
	if err != nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer tail.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(to-from+1, 10))
	w.Header().Set("X-Osimages-In-Progress", "true")
	w.WriteHeader(status)
	pw := &progressWriter{ResponseWriter: w, timeout: s.cfg.SendTimeout}
	if _, err := io.CopyN(pw, tail, to-from+1); err != nil {
		panic(http.ErrAbortHandler)
	}
}

// peerStatuses is the state of every replica for the status page.
func (s *Server) peerStatuses() []ReplicaState {
	if s.cfg.Replicas == nil {
		return nil
	}
	self := s.replicaState()
	out := []ReplicaState{self}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(s.peerViews)) {
		v := s.peerViews[id]
		st := v.state
		st.Replica = id
		if v.err != nil {
			st.Images = nil
		}
		out = append(out, st)
	}
	return out
}

// peerBlobPath is where the peer listener serves the compressed layer of
// the image sum while it pulls it from the registry.
func peerBlobPath(sum string) string { return "/peer/blobs/" + sum }

// peerBlobAnswer is what the peer listener says of the compressed layer
// of an image.
type peerBlobAnswer int

const (
	// blobKept: the layer is kept, to stream.
	blobKept peerBlobAnswer = iota
	// blobNone: there is none and will be none (the image is verified,
	// filled from a peer, or its layer is not offered): copy the image.
	blobNone
	// blobNotYet: this replica has not started keeping it (it has not
	// read the selection yet, or not claimed the image, or is committing
	// it) within PeerTimeout.
	blobNotYet
)

// peerBlob waits (up to PeerTimeout) for the registry pull of sum to say
// whether it keeps its blob: the writer that keeps it, or why there is
// none to stream. A replica that claimed the image but has not started
// keeping its layer is waited for, never taken for one that has none.
func (s *Server) peerBlob(r *http.Request, sum string) (*imagestore.Writer, imagestore.Blob, peerBlobAnswer) {
	deadline := time.Now().Add(s.cfg.PeerTimeout)
	for {
		s.mu.Lock()
		img, known := s.images[sum]
		var writer *imagestore.Writer
		var started, none, committing bool
		if known {
			busy := img.phase == PhaseDownloading || img.phase == PhaseVerifying
			// A verified image is copied whole; a replica that fills from
			// a peer keeps no blob. A source left from an earlier attempt
			// says nothing: the image may be claimed again.
			none = img.stored || busy && strings.HasPrefix(img.source, sourcePeer)
			if !img.stored && img.source == SourceRegistry && busy {
				writer, started = img.writer, img.received > 0
				committing = img.phase == PhaseVerifying
			}
		}
		s.mu.Unlock()
		switch {
		case writer != nil:
			// The blob is kept before the first network byte: once bytes
			// came without one, there will be none; but a commit ends it
			// before the image is stored, and is waited for.
			if b, ok := writer.Blob(); ok {
				// Of unknown length (an HTTP source without
				// archive-size), it is not offered: copy the image.
				if b.Size > 0 {
					return writer, b, blobKept
				}
				return nil, imagestore.Blob{}, blobNone
			}
			if started && !committing {
				return nil, imagestore.Blob{}, blobNone
			}
		case none:
			return nil, imagestore.Blob{}, blobNone
		}
		if time.Now().After(deadline) {
			// An image not known yet may be selected here in a moment, a
			// queued one claimed: neither is a peer without the image.
			return nil, imagestore.Blob{}, blobNotYet
		}
		select {
		case <-r.Context().Done():
			return nil, imagestore.Blob{}, blobNotYet
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// answerNoBlob answers a request for a layer that is not streamed: 404
// when there is none to wait for, 503 with Retry-After when there is none
// yet.
func answerNoBlob(w http.ResponseWriter, answer peerBlobAnswer) {
	if answer == blobNotYet {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "this replica has not started keeping the compressed layer of this image yet", http.StatusServiceUnavailable)
		return
	}
	http.Error(w, "no compressed layer of this image is kept here: copy the image", http.StatusNotFound)
}

// peerBlobDescriptor is the blob kept by a peer, as JSON.
type peerBlobDescriptor struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

func (s *Server) servePeerBlobDescriptor(w http.ResponseWriter, r *http.Request) {
	sum := r.PathValue("sha256")
	if _, err := osimage.ParseSHA256(sum); err != nil {
		http.NotFound(w, r)
		return
	}
	_, b, answer := s.peerBlob(r, sum)
	if answer != blobKept {
		answerNoBlob(w, answer)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(peerBlobDescriptor{Digest: b.Digest, Size: b.Size})
}

func (s *Server) servePeerBlob(w http.ResponseWriter, r *http.Request) {
	sum := r.PathValue("sha256")
	if _, err := osimage.ParseSHA256(sum); err != nil {
		http.NotFound(w, r)
		return
	}
	writer, b, answer := s.peerBlob(r, sum)
	if answer != blobKept {
		answerNoBlob(w, answer)
		return
	}
	if b.Digest != "" {
		w.Header().Set("Docker-Content-Digest", b.Digest)
	}
	s.serveInProgress(w, r, writer.TailBlob, b.Size)
}

// peerBlobDescriptor asks peer p for the compressed layer of sum it keeps
// while it pulls it: kept is false when it keeps none (copy the image).
func (s *Server) peerBlobDescriptor(ctx context.Context, p peers.Peer, sum string) (peerBlobDescriptor, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+peerBlobPath(sum)+"/descriptor", nil)
	if err != nil {
		return peerBlobDescriptor{}, false, err
	}
	resp, err := s.peerPuller.HTTP.Do(req)
	if err != nil {
		return peerBlobDescriptor{}, false, fmt.Errorf("asking peer %s for the compressed layer: %w", p.ID, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return peerBlobDescriptor{}, false, nil
	case http.StatusServiceUnavailable:
		return peerBlobDescriptor{}, false, fmt.Errorf("asking peer %s for the compressed layer: it has not started keeping it within --peer-timeout (%s)", p.ID, s.cfg.PeerTimeout)
	default:
		return peerBlobDescriptor{}, false, fmt.Errorf("asking peer %s for the compressed layer: %s", p.ID, resp.Status)
	}
	var d peerBlobDescriptor
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&d); err != nil {
		return peerBlobDescriptor{}, false, fmt.Errorf("peer %s's compressed layer descriptor: %w", p.ID, err)
	}
	if d.Size <= 0 {
		return peerBlobDescriptor{}, false, fmt.Errorf("peer %s's compressed layer descriptor: size %d", p.ID, d.Size)
	}
	return d, true, nil
}
