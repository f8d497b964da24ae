package replica

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// DefaultPeerTimeout is how long a peer may show no progress before the
// next replica in the rendezvous order takes over.
const DefaultPeerTimeout = 30 * time.Second

// Filler fills a replica's images: from the peers its View chooses, in
// rendezvous order, the registry last. A peer that failed to fill an image
// is skipped for that image until Forget, or until it runs again as
// another instance (State.Instance).
type Filler struct {
	View   *View
	Puller *pull.Puller
	// Wait is how long a peer may show no progress (--peer-timeout).
	Wait time.Duration
	Log  *slog.Logger
	// Registry fills from the registry, under RegistryRule; PeerRule cuts
	// a peer's fill.
	Registry     fill.Source
	RegistryRule func(osimage.SHA256) fill.Rule
	PeerRule     fill.Rule
	// Started is told which source fills an image, before its first byte
	// (peers read it: they follow a registry pull).
	Started func(sum osimage.SHA256, source string)
	// Claim is told of this replica's claim of the registry pull of an
	// image, which its state must show at once (Image.ClaimsRegistry):
	// announced, then confirmed or withdrawn.
	Claim func(sum osimage.SHA256, step ClaimStep)
	// PeerFailed is told of a peer that failed to fill w.
	PeerFailed func(w servedset.Wanted, peer string, err error)

	// failures are the peers that failed each image, shared with the
	// Relay (Failures).
	failures Failures
}

// ClaimStep is a step of a replica's claim of a registry pull.
type ClaimStep int

const (
	// ClaimAnnounced: the image's source is the registry, and it is
	// claiming (Image.Claiming).
	ClaimAnnounced ClaimStep = iota
	// ClaimConfirmed: it pulls from the registry, claiming no more.
	ClaimConfirmed
	// ClaimWithdrawn: it gave way; its source is none until the next.
	ClaimWithdrawn
)

// Fill fills dst with w, and says which source filled it.
func (f *Filler) Fill(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, string, error) {
	chain := fill.Chain{
		// A peer that failed is skipped (isBad, fed by Failed) until it
		// runs as another instance.
		Choose: func(w servedset.Wanted) fill.Source {
			skipped := func(id string) bool { return f.isBad(w.SHA256, id) }
			for {
				if p := f.View.Choose(w.SHA256, skipped); p != nil {
					instance, _ := f.View.instanceOf(p.ID)
					return Source{Peer: *p, Instance: instance, Puller: f.Puller, Wait: f.Wait, Log: f.Log}
				}
				if f.claim(ctx, w, skipped) {
					return nil
				}
			}
		},
		Last: fill.Func{Label: fill.FromRegistry, F: func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
			// Followers stream the compressed layer as it arrives rather
			// than the image: a fraction of the bytes over this NIC.
			dst.KeepBlob()
			return f.Registry.Fill(ctx, w, dst, progress)
		}},
		Rule: func(src fill.Source) fill.Rule {
			if src.Name() == fill.FromRegistry {
				return f.RegistryRule(w.SHA256)
			}
			return f.PeerRule
		},
		Started: func(w servedset.Wanted, src fill.Source) { f.Started(w.SHA256, src.Name()) },
		Failed: func(w servedset.Wanted, src fill.Source, err error) {
			peer := strings.TrimPrefix(src.Name(), fill.FromPeerPrefix)
			instance := ""
			if s, ok := src.(Source); ok {
				instance = s.Instance
			}
			f.failures.Add(w.SHA256, peer, instance)
			f.PeerFailed(w, peer, err)
		},
	}
	return chain.Fill(ctx, w, dst, progress)
}

// claim announces that this replica pulls w from the registry, and
// confirms it against its peers' states read since (View.ConfirmClaim):
// false when it gave way to a peer, which Choose then picks. A peer it
// holds for that neither pulls nor gives way within Wait is passed over.
func (f *Filler) claim(ctx context.Context, w servedset.Wanted, skip func(string) bool) bool {
	log := f.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tell := func(step ClaimStep) {
		if f.Claim != nil {
			f.Claim(w.SHA256, step)
		}
	}
	tell(ClaimAnnounced)
	deadline := time.Now().Add(f.Wait)
	for {
		verdict, peer := f.View.ConfirmClaim(ctx, w.SHA256, skip)
		switch {
		case ctx.Err() != nil:
			// The registry's fill ends at once with ctx's error.
			tell(ClaimConfirmed)
			return true
		case verdict == GiveWay:
			tell(ClaimWithdrawn)
			log.Info("a peer pulls the image from the registry, or claimed it first: following it", "sha256", w.SHA256, "key", w.Key, "peer", peer)
			return false
		case verdict == Proceed:
			tell(ClaimConfirmed)
			return true
		case time.Now().After(deadline):
			log.Warn("a peer that claims the registry pull of the image too neither pulls nor gives way: pulling it", "sha256", w.SHA256, "key", w.Key, "peer", peer, "waited", f.Wait.String())
			tell(ClaimConfirmed)
			return true
		}
		// Hold: the peer reads this claim at its next read.
		select {
		case <-ctx.Done():
		case <-time.After(PollInterval / 5):
		}
	}
}

// isBad says whether peer failed sum, as the instance it runs now
// (Failures.Failed).
func (f *Filler) isBad(sum osimage.SHA256, peer string) bool {
	return f.failures.Failed(f.View, sum, peer)
}

// Failures are the peers that failed each image, for the Relay to skip
// them too and to add those that fail a relay.
func (f *Filler) Failures() *Failures { return &f.failures }

// Forget tries every peer again for sum: it is stored, or no longer known.
func (f *Filler) Forget(sum osimage.SHA256) { f.failures.Forget(sum) }
