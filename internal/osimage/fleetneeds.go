package osimage

import (
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// The fleet's needs, published by the controller in the management
// cluster's namespace for the image server (issue "fleet-driven serving"):
// the server never reads workload namespaces, only this one document.
const (
	// FleetNeedsConfigMapName is the ConfigMap's default name.
	FleetNeedsConfigMapName = "osimages-fleet-needs"
	// FleetNeedsKey is its data key.
	FleetNeedsKey = "needs.yaml"
	// FleetNeedsLabel marks the ConfigMap as osimages' own: one of that
	// name without it is a user's, which the controller never overwrites
	// and the image server never reads.
	FleetNeedsLabel = "osimages.sylva-project.org/fleet-needs"
)

// FleetNeeds is every image some workload cluster needs, by sha256.
type FleetNeeds struct {
	Images []FleetNeed `json:"images"`
	// Refused are the needs left out of the document, and why: a
	// namespace over its share of it, a record over the bound. The image
	// server publishes them with its own refusals, so that they reach the
	// namespace's osimages-status.
	Refused RefusedNeeds `json:"refused,omitempty"`
}

// FleetNeed is one needed image and where it comes from.
type FleetNeed struct {
	SHA256 SHA256 `json:"sha256"`
	// Sources are the records of the needing namespaces' own catalogs,
	// one per distinct record (two namespaces may name one sha256 under
	// other keys, URIs or registries), each with the namespaces that give
	// it. A need whose record no catalog holds (a Metal3 object naming an
	// image its catalog no longer lists) has no source: nothing says where
	// its bytes are.
	Sources []NeedSource `json:"sources,omitempty"`
	// Namespaces are all the namespaces that need it, sorted.
	Namespaces []string `json:"namespaces"`
	// Filenames are, by namespace, the filenames its URLs ask for
	// (/images/<sha256>/<filename>), sorted: each is served, whatever
	// filename another namespace's record gives.
	Filenames map[string][]string `json:"filenames,omitempty"`
}

// NeedSource is one record of a needed image, as os-images-info holds it,
// cut down to the fields the image server reads (NeedFields).
type NeedSource struct {
	// Key is the image's key in those namespaces' os-images-info.
	Key        string   `json:"key"`
	Image      Image    `json:"image"`
	Namespaces []string `json:"namespaces"`
}

// NeedFields are the fields of a record that the image server reads to
// download, verify and serve an image: the only ones the document copies,
// so that a field nobody reads (a long description, a multi-line
// annotation) never takes its room.
var NeedFields = []string{
	FieldURI, FieldRegistryKey, FieldManifestDigest, FieldSHA256, FieldMD5,
	FieldFilename, FieldImageFormat, FieldCompression, FieldArchiveSize, FieldSize,
}

// Bounds of the document. A record cut down to NeedFields is a few hundred
// bytes; MaxNeedRecordBytes leaves room for long URIs and nothing more. The
// needs of all namespaces share NeedsDocumentBudget, fairly (Aggregate):
// the rest of the ConfigMap's 1 MiB is for the refusals.
const (
	MaxNeedRecordBytes  = 4 << 10
	NeedsDocumentBudget = 768 << 10
)

// Data is the ConfigMap data of the fleet's needs. It refuses, with an
// SizeError, needs that a ConfigMap cannot hold.
func (f FleetNeeds) Data(what string) (map[string]string, error) {
	doc, err := yaml.Marshal(f)
	if err != nil {
		return nil, err
	}
	data := map[string]string{FleetNeedsKey: string(doc)}
	if err := CheckConfigMapSize(what, data, len(f.Images)); err != nil {
		return nil, err
	}
	return data, nil
}

// ParseFleetNeeds reads the document back, refusing unknown fields. A need
// or a refusal whose sha256 is malformed is dropped and named in dropped:
// one bad entry never costs the others their needs. Only a document that
// does not parse at all is an error.
func ParseFleetNeeds(data string) (f FleetNeeds, dropped []error, err error) {
	if err := yaml.UnmarshalStrict([]byte(data), &f); err != nil {
		return FleetNeeds{}, nil, fmt.Errorf("%s: %w", FleetNeedsKey, err)
	}
	images := f.Images[:0]
	for _, img := range f.Images {
		sha, err := ParseSHA256(string(img.SHA256))
		if err != nil {
			dropped = append(dropped, fmt.Errorf("%s: a need of %s is dropped: %w", FleetNeedsKey, strings.Join(img.Namespaces, ", "), err))
			continue
		}
		img.SHA256 = sha
		images = append(images, img)
	}
	f.Images = images
	var left []error
	f.Refused, left = parseRefused(f.Refused)
	for _, err := range left {
		dropped = append(dropped, fmt.Errorf("%s: %w", FleetNeedsKey, err))
	}
	return f, dropped, nil
}
