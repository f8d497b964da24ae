package osimage

import (
	"fmt"
	"maps"
	"slices"

	"github.com/opencontainers/go-digest"
	"sigs.k8s.io/yaml"
)

// ServedFilenamesKey is the data key, beside values.yaml in the image
// server's output ConfigMap, of the filenames each served image answers to.
// It is an osimages addition kept out of values.yaml, whose entries have
// exactly the two fields of contract §6: consumers that read values.yaml
// see no change, and propagation copies the key with the rest, so that the
// fleet check in each workload namespace can tell a URL that would answer
// 404.
const ServedFilenamesKey = "served-filenames.yaml"

// ServedFilenames maps the sha256 of each image of the served set to the
// filenames it is served under (/images/<sha256>/<filename>), sorted.
type ServedFilenames map[SHA256][]string

type servedFilenamesDocument struct {
	Filenames ServedFilenames `json:"served_filenames"`
}

// MarshalServedFilenames renders the served-filenames.yaml document.
func MarshalServedFilenames(f ServedFilenames) ([]byte, error) {
	if f == nil {
		f = ServedFilenames{}
	}
	return marshalSorted("served_filenames", f)
}

// ParseServedFilenames reads the served-filenames.yaml document. As in
// ParseServed, an entry whose key is not a sha256 is left out.
func ParseServedFilenames(data []byte) (ServedFilenames, error) {
	var doc servedFilenamesDocument
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing served_filenames document: %w", err)
	}
	return ParseKeys(doc.Filenames), nil
}

// Serves says whether the image of sha256 sha is served under filename.
// known is false when f says nothing of sha (a served set published without
// filenames, by an older server or by Sylva's own): then nobody can tell.
func (f ServedFilenames) Serves(sha SHA256, filename string) (served, known bool) {
	names, ok := f[sha]
	if !ok {
		return false, false
	}
	return slices.Contains(names, filename), true
}

// ServedOCIKey is the data key, beside values.yaml, of the OCI reference
// of each available image: like ServedFilenamesKey, an osimages addition
// that Sylva's consumers never read.
const ServedOCIKey = "served-oci.yaml"

// OCIServed is where the OCI distribution API of the server serves an
// image: oci://<server>/<Repository>@<Manifest>.
type OCIServed struct {
	Repository string        `json:"repository"`
	Manifest   digest.Digest `json:"manifest"`
}

// ServedOCI maps the sha256 of each available image to its OCI reference.
type ServedOCI map[SHA256]OCIServed

type servedOCIDocument struct {
	References ServedOCI `json:"served_oci"`
}

// MarshalServedOCI renders the served-oci.yaml document.
func MarshalServedOCI(o ServedOCI) ([]byte, error) {
	if o == nil {
		o = ServedOCI{}
	}
	return marshalSorted("served_oci", o)
}

// ParseServedOCI reads the served-oci.yaml document; an entry whose key is
// not a sha256 is left out.
func ParseServedOCI(data []byte) (ServedOCI, error) {
	var doc servedOCIDocument
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing served_oci document: %w", err)
	}
	return ParseKeys(doc.References), nil
}

// ServedOutput is everything the image server publishes: the served set
// (contract §6), the filenames of its images and the OCI references of
// the available ones.
type ServedOutput struct {
	Set       ServedSet
	Filenames ServedFilenames
	// OCI is published always; nil when read from a server that does not
	// (an older osimages, or Sylva's own).
	OCI ServedOCI
	// Refused are the fleet's needs the server refuses to serve
	// (RefusedNeedsKey), written only when there are some.
	Refused RefusedNeeds
}

// Equal says whether o and p publish the same thing.
func (o ServedOutput) Equal(p ServedOutput) bool {
	return maps.Equal(o.Set, p.Set) && maps.EqualFunc(o.Filenames, p.Filenames, slices.Equal) && maps.Equal(o.OCI, p.OCI) && slices.Equal(o.Refused, p.Refused)
}

// ConfigMapData renders the data of the served-images ConfigMap, named
// what in errors: values.yaml and served-filenames.yaml. Data that a
// ConfigMap cannot hold is refused with a SizeError.
func (o ServedOutput) ConfigMapData(what string) (map[string]string, error) {
	served, err := MarshalServed(o.Set)
	if err != nil {
		return nil, err
	}
	files, err := MarshalServedFilenames(o.Filenames)
	if err != nil {
		return nil, err
	}
	oci, err := MarshalServedOCI(o.OCI)
	if err != nil {
		return nil, err
	}
	data := map[string]string{ValuesKey: string(served), ServedFilenamesKey: string(files), ServedOCIKey: string(oci)}
	if len(o.Refused) > 0 {
		refused, err := MarshalRefusedNeeds(o.Refused)
		if err != nil {
			return nil, err
		}
		data[RefusedNeedsKey] = string(refused)
	}
	if err := CheckConfigMapSize(what, data, len(o.Set)); err != nil {
		return nil, err
	}
	return data, nil
}
