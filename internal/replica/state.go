package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// State is one replica's images, as its state endpoint (/peer/state)
// answers it.
type State struct {
	Replica string `json:"replica"`
	// Instance names this run of the replica's process (View.Instance).
	// A replica started again under the same ID (a StatefulSet's pod
	// replaced by a rollout keeps its name) is another instance, which
	// its peers try again for the images the previous one failed them.
	Instance string                   `json:"instance,omitempty"`
	Images   map[osimage.SHA256]Image `json:"images"`
}

// Image is one image on one replica.
type Image struct {
	Phase imagelife.Phase `json:"phase"`
	// Source is where the copy comes (or came) from: fill.FromRegistry,
	// fill.FromPeerPrefix and the peer's ID, or fill.FromStore for a copy
	// found on disk at start.
	Source string `json:"source,omitempty"`
	// Claiming: the replica chose to pull the image from the registry
	// (Source is fill.FromRegistry) and checks that no peer does before
	// its first byte (View.ConfirmClaim).
	Claiming   bool      `json:"claiming,omitempty"`
	Received   int64     `json:"received,omitempty"`
	Size       int64     `json:"size,omitempty"`
	VerifiedAt time.Time `json:"verifiedAt,omitzero"`
}

// Verified says whether the replica holds a verified copy.
func (i Image) Verified() bool { return i.Phase == imagelife.PhaseReady }

// PullsFromRegistry says whether the replica is pulling the image from
// the registry now, its claim confirmed: its download may be followed.
func (i Image) PullsFromRegistry() bool {
	return i.Source == fill.FromRegistry && i.busy() && !i.Claiming
}

// ClaimsRegistry says whether the replica chose to pull the image from the
// registry and is confirming it.
func (i Image) ClaimsRegistry() bool {
	return i.Source == fill.FromRegistry && i.busy() && i.Claiming
}

func (i Image) busy() bool {
	return i.Phase == imagelife.PhaseDownloading || i.Phase == imagelife.PhaseVerifying
}

// FillsFromPeer says whether the replica fills the image from a peer now.
func (i Image) FillsFromPeer() bool {
	return strings.HasPrefix(i.Source, fill.FromPeerPrefix) && (i.Phase == imagelife.PhaseDownloading || i.Phase == imagelife.PhaseVerifying)
}

// StatePath is where a replica answers its State.
const StatePath = "/peer/state"

// maxStateBytes bounds a peer's state document: a few hundred bytes per
// image.
const maxStateBytes = 64 << 20

// FetchState reads peer p's state, which must answer as p.
func FetchState(ctx context.Context, client *http.Client, p Peer) (State, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+StatePath, nil)
	if err != nil {
		return State{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return State{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return State{}, fmt.Errorf("%s%s: %s", p.URL, StatePath, resp.Status)
	}
	var st State
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStateBytes)).Decode(&st); err != nil {
		return State{}, fmt.Errorf("%s%s: %w", p.URL, StatePath, err)
	}
	if st.Replica != p.ID {
		return State{}, fmt.Errorf("%s%s answers as replica %q, not %q", p.URL, StatePath, st.Replica, p.ID)
	}
	st.Images = osimage.ParseKeys(st.Images)
	return st, nil
}

// Transport reaches peers directly: they are pods of the same namespace,
// never behind the registry's proxy.
func Transport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return t
}
