package servedset

import (
	"fmt"
	"slices"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Records is the round of download attempts over the records of a fleet
// need (Wanted.Records): which record the next attempt uses, and which
// failed in this round and why. A record that names a wrong tag must not
// hold back a good one, nor its failure reach the namespaces of the
// others. The zero value starts a round.
type Records struct {
	// failed are the records that failed in this round, by recordID,
	// with their error.
	failed map[string]string
}

// recordID names one record of a need: its key and every field the
// download reads, for two namespaces may give one key other records.
func recordID(key string, d osimage.Descriptor) string {
	return fmt.Sprintf("%s\x00%+v", key, d)
}

// Next is what the next download of w uses: w, with the first of its
// records that has not failed in this round. Once every record failed,
// a new round starts from the first.
func (r *Records) Next(w Wanted) Wanted {
	if len(w.Records) == 0 {
		return w
	}
	for _, rec := range w.Records {
		if _, failed := r.failed[recordID(rec.Key, rec.Desc)]; !failed {
			w.Use(rec)
			return w
		}
	}
	r.failed = nil
	w.Use(w.Records[0])
	return w
}

// Failed notes that the download of w from the record of attempt (what
// Next returned) failed with err, and returns the record left to try in
// this round, if any. A need of one record has no round: its failure is
// the image's.
func (r *Records) Failed(w, attempt Wanted, err error) (next Record, ok bool) {
	if len(w.Records) < 2 {
		return Record{}, false
	}
	if r.failed == nil {
		r.failed = map[string]string{}
	}
	r.failed[recordID(attempt.Key, attempt.Desc)] = err.Error()
	for _, rec := range w.Records {
		if _, failed := r.failed[recordID(rec.Key, rec.Desc)]; !failed {
			return rec, true
		}
	}
	return Record{}, false
}

// Reset starts a new round (the image was stored, or the inputs changed).
func (r *Records) Reset() { r.failed = nil }

// Refusals are, for a need w that failed from every record, the reason
// each needing namespace's own record gave (reason, the image's, for a
// need of one record): published with the refused needs, so that it
// reaches that namespace's status, and only that namespace's.
func (r *Records) Refusals(w Wanted, reason string) osimage.RefusedNeeds {
	var out osimage.RefusedNeeds
	for _, rec := range w.Records {
		why, failed := r.failed[recordID(rec.Key, rec.Desc)]
		if !failed && len(w.Records) == 1 {
			why, failed = reason, reason != ""
		}
		if !failed {
			continue
		}
		for _, ns := range rec.Namespaces {
			if slices.Contains(w.ForNamespaces, ns) {
				out = append(out, osimage.RefusedNeed{SHA256: w.SHA256, Namespace: ns, Reason: osimage.RefusedDownload,
					Message: fmt.Sprintf("downloading it from this namespace's record %s (%s) failed: %s", rec.Key, rec.Desc.URI, clip(why, 512))})
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
