package osimage

import (
	"fmt"

	"github.com/opencontainers/go-digest"
	"sigs.k8s.io/yaml"
)

// The osimages-status ConfigMap (StatusConfigMapName, labelled StatusLabel)
// of each workload-cluster namespace holds two documents, each written by
// its own reconciler of osimages controller and read by propagate and
// plan: what the fleet check found of the images the namespace needs
// (StatusKey, CheckReport), and the state of its catalog
// (CatalogStatusKey, CatalogStatus).
const (
	StatusConfigMapName = "osimages-status"
	StatusLabel         = "osimages.sylva-project.org/status"
	StatusKey           = "status.yaml"
	CatalogStatusKey    = "catalog.yaml"
)

// ImageState is where a needed image stands in the management cluster.
type ImageState string

// The states of a needed image.
const (
	StateServed       ImageState = "served"
	StateNotAvailable ImageState = "not-available"
	StateNotServed    ImageState = "not-served"
)

// ImageStatus is one needed image and its state.
type ImageStatus struct {
	SHA256   SHA256 `json:"sha256"`
	ImageKey string `json:"imageKey,omitempty"`
	// Filenames are those its URLs ask for (/images/<sha256>/<filename>).
	Filenames []string `json:"filenames,omitempty"`
	// Manifests are the manifest digests its oci:// URLs ask for
	// (oci://<host>/images/<sha256>@<manifest>).
	Manifests []digest.Digest `json:"manifests,omitempty"`
	State     ImageState      `json:"state"`
	NeededBy  []string        `json:"neededBy"`
	// Message is render's error for this image, when it is not served.
	Message string `json:"message,omitempty"`
	// Refused is why the image server refuses to serve it for this
	// namespace (serve --serve-fleet-needs), when it does.
	Refused string `json:"refused,omitempty"`
}

// CheckReport is the state of one workload-cluster namespace, as the
// fleet check (internal/fleet) found it: the document of StatusKey.
type CheckReport struct {
	Namespace string `json:"namespace"`
	// ServedSet names the copy of the served set checked against.
	ServedSet string `json:"servedSet"`
	// ServedSetFound is false when the copy is missing: every image is
	// then not served, as render would say.
	ServedSetFound bool          `json:"servedSetFound"`
	Images         []ImageStatus `json:"images"`
	// Errors are what could not be worked out from the cluster's inputs.
	Errors []string `json:"errors,omitempty"`
}

// Problems returns the images that are needed and not served or not
// available.
func (r CheckReport) Problems() []ImageStatus {
	var out []ImageStatus
	for _, img := range r.Images {
		if img.State != StateServed {
			out = append(out, img)
		}
	}
	return out
}

// Count returns how many needed images are in state s.
func (r CheckReport) Count(s ImageState) int {
	n := 0
	for _, img := range r.Images {
		if img.State == s {
			n++
		}
	}
	return n
}

// Summary is one line for logs and events.
func (r CheckReport) Summary() string {
	return fmt.Sprintf("%d images needed: %d served, %d not available yet, %d not served; %d input problems",
		len(r.Images), r.Count(StateServed), r.Count(StateNotAvailable), r.Count(StateNotServed), len(r.Errors))
}

// MarshalCheckReport renders the document of StatusKey.
func MarshalCheckReport(r CheckReport) ([]byte, error) { return yaml.Marshal(r) }

// ParseCheckReport reads a status document back. An image whose sha256 is not
// one (a status written by hand) is left out: it names no image.
func ParseCheckReport(data string) (CheckReport, error) {
	var r CheckReport
	if err := yaml.UnmarshalStrict([]byte(data), &r); err != nil {
		return r, err
	}
	images := r.Images[:0]
	for _, img := range r.Images {
		sha, err := ParseSHA256(string(img.SHA256))
		if err != nil {
			continue
		}
		img.SHA256 = sha
		images = append(images, img)
	}
	r.Images = images
	return r, nil
}

// The states of a namespace's catalog, in osimages-status and the
// osimages_catalog_state metric.
const (
	CatalogRunning   = "running"
	CatalogPublished = "published"
	CatalogFailed    = "failed"
	CatalogTimedOut  = "timed-out"
	CatalogRefused   = "refused"
)

// CatalogStatus is the catalog's document of osimages-status.
type CatalogStatus struct {
	State      string `json:"state"`
	InputsHash string `json:"inputsHash,omitempty"`
	// Since is when the state began (RFC 3339): a run "running" for long
	// is stuck on its registries.
	Since   string `json:"since"`
	Images  int    `json:"images,omitempty"`
	Message string `json:"message,omitempty"`
}
