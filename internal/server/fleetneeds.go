package server

import (
	"encoding/json"
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
	all := slices.Concat(s.refusedNeeds, s.downloadRefusalsLocked())
	all.Sort()
	size := func(r osimage.RefusedNeed) int {
		return len(r.SHA256) + len(r.Namespace) + len(r.Reason) + len(r.Message) + 64
	}
	total := 0
	for _, r := range all {
		total += size(r)
	}
	if total <= maxRefusedBytes {
		return all
	}
	var kept osimage.RefusedNeeds
	used, taken, seen := 0, make([]bool, len(all)), map[string]bool{}
	take := func(i int) {
		if !taken[i] && used+size(all[i]) <= maxRefusedBytes {
			taken[i], used = true, used+size(all[i])
			kept = append(kept, all[i])
		}
	}
	for i, r := range all {
		if !seen[r.Namespace] {
			seen[r.Namespace] = true
			take(i)
		}
	}
	for i := range all {
		take(i)
	}
	kept.Sort()
	return kept
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

// recordID names one record of a need: its key and every field the
// download reads, for two namespaces may give one key other records.
func recordID(key string, img osimage.Image) string {
	doc, _ := json.Marshal(img)
	return key + "\x00" + string(doc)
}

// attempt is what the next download of img uses: its Wanted, with the
// first of its records that has not failed in this round of attempts.
// Once every record failed (and the backoff passed), a new round starts
// from the first.
func (img *image) attempt() servedset.Wanted {
	w := img.Wanted
	if len(w.Records) == 0 {
		return w
	}
	for _, r := range w.Records {
		if _, failed := img.recordFailed[recordID(r.Key, r.Image)]; !failed {
			w.Key, w.Image = r.Key, r.Image
			return w
		}
	}
	img.recordFailed = nil
	w.Key, w.Image = w.Records[0].Key, w.Records[0].Image
	return w
}

// nextRecordLocked notes that the download of img from the record of w
// failed with err, and says whether another record is left to try in
// this round: then img is queued again at once, not failed, for a record
// that names a wrong tag must not hold back a good one.
func (s *Server) nextRecordLocked(img *image, w servedset.Wanted, err error) (reason string, ok bool) {
	if len(img.Records) < 2 {
		return "", false
	}
	if img.recordFailed == nil {
		img.recordFailed = map[string]string{}
	}
	img.recordFailed[recordID(w.Key, w.Image)] = err.Error()
	for _, r := range img.Records {
		if _, failed := img.recordFailed[recordID(r.Key, r.Image)]; !failed {
			s.log.Warn("download failed from one record of a fleet need; trying the next", "sha256", img.SHA256, "failedKey", w.Key, "nextKey", r.Key, "error", err)
			return fmt.Sprintf("the record %s failed (%v); trying the record %s", w.Key, err, r.Key), true
		}
	}
	return "", false
}

// downloadRefusalsLocked are, for the fleet needs that failed from every
// record, the reason each needing namespace's own record gave: published
// with the refused needs, so that it reaches that namespace's status, and
// only that namespace's.
func (s *Server) downloadRefusalsLocked() osimage.RefusedNeeds {
	var out osimage.RefusedNeeds
	for sum, img := range s.images {
		if !img.Selected || img.Stored || img.Phase != PhaseFailed || !img.IsNeed() {
			continue
		}
		for _, r := range img.Records {
			why, failed := img.recordFailed[recordID(r.Key, r.Image)]
			if !failed && len(img.Records) == 1 {
				why, failed = img.Reason, img.Reason != ""
			}
			if !failed {
				continue
			}
			for _, ns := range r.Namespaces {
				if slices.Contains(img.ForNamespaces, ns) {
					out = append(out, osimage.RefusedNeed{SHA256: sum, Namespace: ns, Reason: osimage.RefusedDownload,
						Message: fmt.Sprintf("downloading it from this namespace's record %s (%s) failed: %s", r.Key, r.Image.Get(osimage.FieldURI), clip(why, 512))})
				}
			}
		}
	}
	return out
}

// clip bounds a message published for a tenant.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// yieldError ends a fleet need's download whose space reservation a
// management image waits for: it goes back to the queue, its partial
// kept, without counting as a failure.
type yieldError struct{ image string }

func (e *yieldError) Error() string {
	return fmt.Sprintf("gave way to the management image %s, which waits for the space this download reserved; it continues once there is room", e.image)
}
