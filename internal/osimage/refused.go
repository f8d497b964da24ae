package osimage

import (
	"cmp"
	"fmt"
	"slices"

	"sigs.k8s.io/yaml"
)

// RefusedNeedsKey is the data key, beside values.yaml in the image
// server's output ConfigMap, of the fleet's needs that the server refuses
// to serve (--serve-fleet-needs) and why. Propagation copies it with the
// rest, so that the check in each workload namespace tells the tenant the
// exact reason its image is not served. It is written only when some need
// is refused: a server without the option publishes what it always did.
const RefusedNeedsKey = "refused-needs.yaml"

// The reasons of a refused need, as metrics label them.
const (
	// RefusedRegistry: an OCI record from a registry the management values
	// do not declare.
	RefusedRegistry = "registry-not-allowed"
	// RefusedURI: an HTTP(S) record under no allowed prefix.
	RefusedURI = "uri-not-allowed"
	// RefusedImages and RefusedBytes: the namespace's quota is reached.
	RefusedImages = "quota-images"
	RefusedBytes  = "quota-bytes"
	// RefusedStorage: what --max-storage leaves beside the management
	// selection is taken by other namespaces' shares.
	RefusedStorage = "storage"
	// RefusedNoRecord: no catalog of a needing namespace describes it.
	RefusedNoRecord = "no-record"
	// RefusedInvalid: the record cannot be served as it is.
	RefusedInvalid = "invalid"
	// RefusedDocumentShare: the namespace's needs are over its share of the
	// fleet's needs document; none is published (SHA256 is "").
	RefusedDocumentShare = "document-share"
	// RefusedDownload: every admitted record was tried and none gave the
	// image; Message says what this namespace's own record gave.
	RefusedDownload = "download-failed"
)

// RefusedNeed is one image that one namespace needs and that the image
// server does not serve, by policy.
type RefusedNeed struct {
	// SHA256 is the image refused; "" refuses every need of the
	// namespace (RefusedDocumentShare).
	SHA256    SHA256 `json:"sha256"`
	Namespace string `json:"namespace"`
	// Reason is a short word for metrics, one of the Refused* constants.
	Reason string `json:"reason"`
	// Message is the exact reason, for the tenant.
	Message string `json:"message"`
}

// RefusedNeeds are the refusals, sorted by namespace, then sha256.
type RefusedNeeds []RefusedNeed

type refusedNeedsDocument struct {
	Refused RefusedNeeds `json:"refused_needs"`
}

// Sort puts the refusals in their document order.
func (r RefusedNeeds) Sort() {
	slices.SortFunc(r, func(a, b RefusedNeed) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.SHA256, b.SHA256))
	})
}

// For returns the refusal of sha256 for namespace, if any: its own, else
// one of every need of the namespace.
func (r RefusedNeeds) For(namespace string, sha SHA256) (RefusedNeed, bool) {
	var all *RefusedNeed
	for i, n := range r {
		switch {
		case n.Namespace != namespace:
		case n.SHA256 == sha:
			return n, true
		case n.SHA256 == "" && all == nil:
			all = &r[i]
		}
	}
	if all != nil {
		return *all, true
	}
	return RefusedNeed{}, false
}

// MarshalRefusedNeeds renders the refused-needs.yaml document.
func MarshalRefusedNeeds(r RefusedNeeds) ([]byte, error) {
	if r == nil {
		r = RefusedNeeds{}
	}
	return yaml.Marshal(refusedNeedsDocument{Refused: r})
}

// ParseRefusedNeeds reads the refused-needs.yaml document. A refusal whose
// sha256 is neither "" nor a sha256 is left out: it refuses no image.
func ParseRefusedNeeds(data []byte) (RefusedNeeds, error) {
	var doc refusedNeedsDocument
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing refused_needs document: %w", err)
	}
	refused, _ := parseRefused(doc.Refused)
	return refused, nil
}

// parseRefused parses the sha256 of each refusal of a document just
// decoded: it returns those whose sha256 is "" or parses, and why each
// other is left out.
func parseRefused(decoded RefusedNeeds) (kept RefusedNeeds, left []error) {
	for _, r := range decoded {
		if r.SHA256 != "" {
			sha, err := ParseSHA256(string(r.SHA256))
			if err != nil {
				left = append(left, fmt.Errorf("a refusal of namespace %s is dropped: %w", r.Namespace, err))
				continue
			}
			r.SHA256 = sha
		}
		kept = append(kept, r)
	}
	return kept, left
}

// Bounded returns the refusals sorted, at most maxBytes of them (counted
// as their fields plus 64 bytes each): when all do not fit, the first
// refusal of each namespace stays, then as many others as fit. Tenants
// choose how many refusals they cause; the document that carries them
// beside the served set must still fit its ConfigMap.
func (r RefusedNeeds) Bounded(maxBytes int) RefusedNeeds {
	all := slices.Clone(r)
	all.Sort()
	size := func(r RefusedNeed) int {
		return len(r.SHA256) + len(r.Namespace) + len(r.Reason) + len(r.Message) + 64
	}
	total := 0
	for _, r := range all {
		total += size(r)
	}
	if total <= maxBytes {
		return all
	}
	var kept RefusedNeeds
	used, taken, seen := 0, make([]bool, len(all)), map[string]bool{}
	take := func(i int) {
		if !taken[i] && used+size(all[i]) <= maxBytes {
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
