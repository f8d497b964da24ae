package replica

import (
	"sync"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Failures remembers the peers that failed each image, with the instance
// that failed it: a fill from the peer that broke off, or a relay of its
// copy to a client that it answered wrongly, cut or stalled. The Filler
// and the Relay share one, so that a peer that failed one is asked for
// that image by neither, until it runs as another instance or the image
// is forgotten. The zero Failures remembers nothing yet.
type Failures struct {
	mu  sync.Mutex
	bad map[osimage.SHA256]map[string]string
}

// Add remembers that peer, running as instance, failed sum.
func (f *Failures) Add(sum osimage.SHA256, peer, instance string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bad == nil {
		f.bad = map[osimage.SHA256]map[string]string{}
	}
	if f.bad[sum] == nil {
		f.bad[sum] = map[string]string{}
	}
	f.bad[sum][peer] = instance
}

// Failed says whether peer failed sum as the instance v last read of it.
// A peer started again since (a pod replaced by a rollout, under the same
// name) is tried again: the process that failed is gone, and the new one
// may pull the image from the registry already. Skipped, it would be left
// out of this replica's claim too (View.ConfirmClaim), and both would
// pull the image from the registry.
func (f *Failures) Failed(v *View, sum osimage.SHA256, peer string) bool {
	f.mu.Lock()
	failed, ok := f.bad[sum][peer]
	f.mu.Unlock()
	if !ok {
		return false
	}
	now, read := v.instanceOf(peer)
	return !read || now == "" || now == failed
}

// Forget tries every peer again for sum: it is stored, or no longer known.
func (f *Failures) Forget(sum osimage.SHA256) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.bad, sum)
}
