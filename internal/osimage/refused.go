package osimage

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// RefusedNeedsKey is the data key, beside values.yaml in the image
// server's output ConfigMap, of the fleet's needs that the server refuses
// to serve (--serve-fleet-needs) and why. Propagation copies it with the
// rest, so that the check in each workload namespace tells the tenant the
// exact reason its image is not served. It is written only when some need
// is refused: a server without the option publishes what it always did.
const RefusedNeedsKey = "refused-needs.yaml"

// RefusedNeed is one image that one namespace needs and that the image
// server does not serve, by policy.
type RefusedNeed struct {
	SHA256    string `json:"sha256"`
	Namespace string `json:"namespace"`
	// Reason is a short word for metrics: registry-not-allowed,
	// uri-not-allowed, quota-images, quota-bytes, no-record, invalid.
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
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.SHA256, b.SHA256)
	})
}

// For returns the refusal of sha256 for namespace, if any.
func (r RefusedNeeds) For(namespace, sha string) (RefusedNeed, bool) {
	for _, n := range r {
		if n.Namespace == namespace && n.SHA256 == sha {
			return n, true
		}
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

// ParseRefusedNeeds reads the refused-needs.yaml document.
func ParseRefusedNeeds(data []byte) (RefusedNeeds, error) {
	var doc refusedNeedsDocument
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing refused_needs document: %w", err)
	}
	return doc.Refused, nil
}
