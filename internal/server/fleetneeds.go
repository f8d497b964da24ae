package server

import (
	"fmt"
	"slices"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// The fleet's needs (--serve-fleet-needs): the images the server serves
// because workload clusters need them come in through SetDesired like any
// other; what the policy refuses is kept here, published beside the
// served set (osimage.RefusedNeedsKey), shown on the status page and
// counted in a metric.

// SetRefusedNeeds replaces the fleet's needs refused by policy. Call it
// before SetDesired, which publishes them with the served set.
func (s *Server) SetRefusedNeeds(r osimage.RefusedNeeds) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refusedNeeds = r
	s.signal(s.changed)
}

// RefusedNeeds are the fleet's needs refused by policy, and those whose
// every record failed to download.
func (s *Server) RefusedNeeds() osimage.RefusedNeeds {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusedLocked()
}

// maxRefusedBytes bounds the refusals published beside the served set,
// which must fit in the same ConfigMap: past it, the first refusal of
// each namespace stays, then as many others as fit. Tenants choose how
// many refusals they cause; they never choose whether the served set is
// published.
const maxRefusedBytes = 256 << 10

func (s *Server) refusedLocked() osimage.RefusedNeeds {
	return slices.Concat(s.refusedNeeds, s.downloadRefusalsLocked()).Bounded(maxRefusedBytes)
}

// StoredSizes are the images stored, sha256 -> bytes: what the fleet's
// needs may keep (servedset.FleetNeeds admits them first) and what takes
// room already.
func (s *Server) StoredSizes() map[osimage.SHA256]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[osimage.SHA256]int64{}
	for sum, img := range s.images {
		if img.Stored {
			out[sum] = img.entry.Size
		}
	}
	return out
}

// The order of claims: the management selection before any need, so that
// a need, whatever its key, never delays what the management cluster
// selects; among needs, those of the namespaces with the fewest downloads
// in progress first, so that one namespace's many needs do not hold every
// slot. Within each, the images that never gave way first, then by key
// (management) or sha256 (needs: a tenant chooses its keys).
func claimsBefore(a, b *image, inProgress map[string]int) bool {
	if a.IsNeed() != b.IsNeed() {
		return !a.IsNeed()
	}
	if a.GaveWay != b.GaveWay {
		return !a.GaveWay
	}
	if !a.IsNeed() {
		return a.Key < b.Key
	}
	if la, lb := leastBusy(a, inProgress), leastBusy(b, inProgress); la != lb {
		return la < lb
	}
	return a.SHA256 < b.SHA256
}

// leastBusy is the fewest downloads in progress of one namespace img is a
// need of.
func leastBusy(img *image, inProgress map[string]int) int {
	least := -1
	for _, ns := range img.ForNamespaces {
		if n := inProgress[ns]; least < 0 || n < least {
			least = n
		}
	}
	return least
}

// needsInProgressLocked counts the downloads in progress of each needing
// namespace.
func (s *Server) needsInProgressLocked() map[string]int {
	out := map[string]int{}
	for _, img := range s.images {
		if img.Phase == PhaseDownloading || img.Phase == PhaseVerifying {
			for _, ns := range img.ForNamespaces {
				out[ns]++
			}
		}
	}
	return out
}

// nextRecordLocked notes that the download of img from the record of w
// failed with err, and says whether another record is left to try in
// this round: then img is queued again at once, not failed, for a record
// that names a wrong tag must not hold back a good one.
func (s *Server) nextRecordLocked(img *image, w servedset.Wanted, err error) (reason string, ok bool) {
	next, ok := img.records.Failed(img.Wanted, w, err)
	if !ok {
		return "", false
	}
	s.log.Warn("download failed from one record of a fleet need; trying the next", "sha256", img.SHA256, "failedKey", w.Key, "nextKey", next.Key, "error", err)
	return fmt.Sprintf("the record %s failed (%v); trying the record %s", w.Key, err, next.Key), true
}

// downloadRefusalsLocked are the refusals of the fleet needs that failed
// from every record, for each needing namespace (servedset.Records).
func (s *Server) downloadRefusalsLocked() osimage.RefusedNeeds {
	var out osimage.RefusedNeeds
	for _, img := range s.images {
		if img.Selected && !img.Stored && img.Phase == PhaseFailed && img.IsNeed() {
			out = append(out, img.records.Refusals(img.Wanted, img.Reason)...)
		}
	}
	return out
}

// yieldError ends a fleet need's download whose space reservation a
// management image waits for: it goes back to the queue, its partial
// kept, without counting as a failure.
type yieldError struct{ image string }

func (e *yieldError) Error() string {
	return fmt.Sprintf("gave way to the management image %s, which waits for the space this download reserved; it continues once there is room", e.image)
}
