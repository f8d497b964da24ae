package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// With replicas (package replica), the server is the Holder of the peer
// endpoints and asks its replica.View who pulls what, what is available
// and whether it is ready.

// PeerReporter reports a peer that failed or sent bad bytes, beside the
// log line and the metric (a Kubernetes event, say).
type PeerReporter func(peer string, sha256 osimage.SHA256, reason string)

// State is this replica's images, as its peers read them.
func (s *Server) State() replica.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := replica.State{Replica: s.view.Self(), Instance: s.view.Instance(), Images: map[osimage.SHA256]replica.Image{}}
	for sum, img := range s.images {
		ri := replica.Image{Phase: img.Phase, Source: img.source, Claiming: img.claiming, Received: img.received}
		if img.Stored {
			ri.Phase, ri.Size, ri.VerifiedAt = PhaseReady, img.entry.Size, img.entry.VerifiedAt
		}
		out.Images[sum] = ri
	}
	return out
}

// Offer says what this replica can send its peers of sum under name ("":
// its compressed layer).
func (s *Server) Offer(sum osimage.SHA256, name string) replica.Offer {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok {
		return replica.Offer{}
	}
	stored := img.Stored && img.Phase == PhaseReady
	busy := img.Phase == PhaseDownloading || img.Phase == PhaseVerifying
	o := replica.Offer{
		Known:  name == "" || slices.Contains(img.ServedAs(), name) || stored && img.entry.Filename == name,
		Stored: stored,
		Size:   img.Desc.Size,
	}
	// A fill from a peer is offered as one from the registry: followers
	// chain from it (replica.Tree), each verifying every byte itself, and
	// keep following its layer when its own source dies and the next
	// continues it.
	if !img.Stored && busy && img.writer != nil {
		o.Download, o.Started, o.Committing = img.writer, img.received > 0, img.Phase == PhaseVerifying
	}
	return o
}

// Changed is closed at the next change of an image's state.
func (s *Server) Changed() <-chan struct{} {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	return s.notify
}

// broadcast wakes whoever waits on Changed.
func (s *Server) broadcast() {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	close(s.notify)
	s.notify = make(chan struct{})
}

// ServeStored serves the verified file of sum to a peer.
func (s *Server) ServeStored(w http.ResponseWriter, r *http.Request, sum osimage.SHA256) {
	s.endpoints().ServeStored(w, r, sum)
}

// PeerHTTPServer is the http.Server of the peer endpoints.
func (s *Server) PeerHTTPServer() *http.Server {
	return replica.Endpoints{Holder: s, Wait: s.cfg.PeerTimeout, SendTimeout: s.cfg.SendTimeout}.Server()
}

// availableLocked: without replicas an image is available once stored;
// with them, once every ready replica holds it (replica.View.Available).
func (s *Server) availableLocked(sum osimage.SHA256, img *image) bool {
	held := img.Phase == PhaseReady && img.Stored
	if s.view == nil {
		return held
	}
	return s.view.Available(sum, held, s.lastAvailable[sum])
}

// SetLeader says whether this replica publishes (it holds the Lease).
// Becoming leader publishes at once, whatever another leader wrote.
func (s *Server) SetLeader(leader bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leader = leader
	s.published = osimage.ServedOutput{}
	if leader {
		s.log.Info("this replica leads: it publishes the served set", "replica", s.view.Self())
	} else {
		s.log.Info("this replica does not lead: another publishes the served set", "replica", s.view.Self())
	}
	s.signal(s.changed)
}

func (s *Server) isLeader() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.view != nil && s.leader
}

func (s *Server) publishesLocked() bool { return s.view == nil || s.leader }

// claimableLocked: with replicas, nothing is claimed before the replica
// set is known and settled (replica.View.Claimable).
func (s *Server) claimableLocked() bool { return s.view == nil || s.view.Claimable() }

// ReplicaReady is the readiness of a replica: until it holds every
// selected image a ready peer holds verified, it stays out of the Service
// (it fills from its peers meanwhile), so that any replica can answer any
// URL published as available. Once ready it stays so. Without replicas it
// is always true.
func (s *Server) ReplicaReady() (bool, string) {
	if s.view == nil {
		return true, ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readyOnce {
		return true, ""
	}
	if s.phaseLocked() == imagehttp.ServerStarting || !s.view.Known() {
		return false, "the inputs and the peers are being read"
	}
	var missing []string
	for sum, img := range s.images {
		if img.Selected && !img.Stored && s.view.HeldByReadyPeer(sum) {
			missing = append(missing, string(sum))
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return false, fmt.Sprintf("filling %d images that peers serve: %s", len(missing), strings.Join(missing, ", "))
	}
	s.readyOnce = true
	return true, ""
}

// fill fills dst with w: from the registry, or with replicas from the
// chain of peers the view chooses, the registry last (replica.Filler). It
// says which source filled it.
func (s *Server) fill(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, string, error) {
	if s.filler != nil {
		return s.filler.Fill(ctx, w, dst, progress)
	}
	s.setSource(w.SHA256, fill.FromRegistry)
	res, err := s.registryRule(w.SHA256).Run(ctx, func(ctx context.Context, progress pull.Progress) (pull.Result, error) {
		return s.cfg.Pull(ctx, w, dst, progress)
	}, progress)
	return res, fill.FromRegistry, err
}

// registryRule cuts a registry pull of sum that stalls for StallTimeout,
// or that is slower than MinRate while another image waits for its slot.
func (s *Server) registryRule(sum osimage.SHA256) fill.Rule {
	return fill.Rule{
		Stall: s.cfg.StallTimeout, MinRate: s.cfg.MinRate, StallName: "--stall-timeout", MinRateName: "--min-rate", Clock: s.cfg.Clock,
		Contended: func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.waitingLocked(sum)
		},
	}
}

// peerRule cuts a peer fill that stalls for PeerTimeout, or that is slower
// than MinRate, whether or not an image waits for a slot: a peer that
// trickles would hold the fill for ever, and the registry, or another
// peer, is there to take over.
func (s *Server) peerRule() fill.Rule {
	return fill.Rule{
		Stall: s.cfg.PeerTimeout, MinRate: s.cfg.MinRate, RateWindow: s.cfg.StallTimeout,
		StallName: "--peer-timeout", MinRateName: "--min-rate", Clock: s.cfg.Clock,
	}
}

func (s *Server) setSource(sum osimage.SHA256, source string) {
	s.mu.Lock()
	if img, ok := s.images[sum]; ok {
		img.source, img.claiming = source, false
	}
	s.mu.Unlock()
	s.broadcast()
}

// setClaim shows a step of this replica's claim of the registry pull of
// sum in its state, at once: peers judge their own claims from it.
func (s *Server) setClaim(sum osimage.SHA256, step replica.ClaimStep) {
	s.mu.Lock()
	if img, ok := s.images[sum]; ok {
		switch step {
		case replica.ClaimAnnounced:
			img.source, img.claiming = fill.FromRegistry, true
		case replica.ClaimConfirmed:
			img.source, img.claiming = fill.FromRegistry, false
		case replica.ClaimWithdrawn:
			img.source, img.claiming = "", false
		}
	}
	s.mu.Unlock()
	s.broadcast()
}

// reportPeer logs, counts and reports a peer that failed to fill an
// image (replica.Filler skips it for that image).
func (s *Server) reportPeer(w servedset.Wanted, peer string, err error) {
	reason := "failed"
	switch {
	case isVerifyError(err):
		reason = "bad-bytes"
	case errors.As(err, new(*fill.SlowError)):
		reason = "slow"
	}
	s.log.Warn("peer failed to fill an image; filling it from elsewhere", "peer", peer, "sha256", w.SHA256, "key", w.Key, "reason", reason, "error", err.Error())
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.PeerFailures.WithLabelValues(peer, reason).Inc()
	}
	if s.cfg.ReportPeer != nil {
		s.cfg.ReportPeer(peer, w.SHA256, fmt.Sprintf("%s: %v", reason, err))
	}
}

// peerStatuses is the state of every replica for the status page.
func (s *Server) peerStatuses() []replica.State {
	if s.view == nil {
		return nil
	}
	return append([]replica.State{s.State()}, s.view.States()...)
}
