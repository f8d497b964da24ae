package osimage

import (
	"fmt"
	"maps"
	"os"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/values"
)

// Names fixed by the contract.
const (
	// ValuesKey is the ConfigMap data key that holds the YAML document.
	ValuesKey = "values.yaml"

	InfoConfigMapName = "os-images-info"
	InfoLabel         = "sylva.os-images-info"

	ServedConfigMapName      = "capm3-os-image-server-os-images"
	ServedConfigMapNamespace = "sylva-system"
)

// MarshalInfo renders the values.yaml document of os-images-info. Image
// keys come out in byte order (marshalSorted), so equal catalogs give equal
// bytes.
func MarshalInfo(c Catalog) ([]byte, error) {
	if c == nil {
		c = Catalog{}
	}
	return marshalSorted("os_images", c)
}

// ParseInfo reads the values.yaml document of an os-images-info ConfigMap.
// Fields are kept as the document has them, whatever their type: they are
// checked where they are read (see Image).
func ParseInfo(data []byte) (Catalog, error) {
	var doc struct {
		OSImages any `json:"os_images"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing os_images document: %w", err)
	}
	if doc.OSImages == nil {
		return Catalog{}, nil
	}
	m, ok := doc.OSImages.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("os_images: must be a map of image key to image fields, got %s", Describe(doc.OSImages))
	}
	return CatalogFromValues(m, "os_images")
}

// CatalogFromValues converts a generic os_images map, as found in values,
// into a Catalog. A null entry stays in it as a nil Image; an entry that is
// neither a map nor null is refused. path names the map in error messages.
func CatalogFromValues(m map[string]any, path string) (Catalog, error) {
	out := make(Catalog, len(m))
	for _, key := range slices.Sorted(maps.Keys(m)) {
		switch fields := m[key].(type) {
		case nil:
			out[key] = nil
		case map[string]any:
			out[key] = Image(fields).Clone()
		default:
			return nil, fmt.Errorf("%s.%s: must be a map of image fields, got %s", path, key, Describe(m[key]))
		}
	}
	return out, nil
}

// ServedImage is one entry of capm3_os_image_server_images.
type ServedImage struct {
	Available bool   `json:"available"`
	ImageKey  string `json:"image_key"`
}

// ServedSet is capm3_os_image_server_images: image sha256 -> entry.
type ServedSet map[SHA256]ServedImage

// Require says whether s serves the image of sha256 sha (key in (A)) and
// has it available, with the error texts of contract §9 that rendering
// fails with; the fleet check reports them too.
func (s ServedSet) Require(sha SHA256, key string) error {
	entry, ok := s[sha]
	if !ok {
		return fmt.Errorf("image %s/%s is currently not served by mgmt cluster os-image-server", sha, key)
	}
	if !entry.Available {
		return fmt.Errorf("image %s/%s is known to the mgmt cluster os-image-server but not available yet: it is still being prepared (downloading), or preparing it failed; see the os-image-server status", sha, key)
	}
	return nil
}

type servedDocument struct {
	Images ServedSet `json:"capm3_os_image_server_images"`
}

// MarshalServed renders the values.yaml document of the served-images
// ConfigMap.
func MarshalServed(s ServedSet) ([]byte, error) {
	if s == nil {
		s = ServedSet{}
	}
	return marshalSorted("capm3_os_image_server_images", s)
}

// ParseServed reads the values.yaml document of the served-images ConfigMap.
// Unknown entry fields are refused, as the consumer's schema does. An
// entry whose key is not a sha256 (ParseSHA256) is left out: no image can
// be looked up under it, since every sha256 looked up is a parsed one.
func ParseServed(data []byte) (ServedSet, error) {
	var doc servedDocument
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing capm3_os_image_server_images document: %w", err)
	}
	return ParseKeys(doc.Images), nil
}

// ParseKeys returns the entries of decoded, a map just decoded from a
// document (its keys taken as they came), whose key parses as a sha256
// (ParseSHA256): the keys a document gives are parsed where it is read,
// once, and a key that is not a sha256 is left out, since no image can be
// looked up under it. The result is never nil.
func ParseKeys[M ~map[SHA256]V, V any](decoded M) M {
	out := make(M, len(decoded))
	for raw, v := range decoded {
		if sha, err := ParseSHA256(string(raw)); err == nil {
			out[sha] = v
		}
	}
	return out
}

// ValuesDocument returns the values.yaml document held by data: data itself
// when it is such a document, or its values.yaml key when data is a
// ConfigMap manifest (as `kubectl get -o yaml` prints it).
func ValuesDocument(data []byte) ([]byte, error) {
	var head struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	if head.Kind != "ConfigMap" {
		return data, nil
	}
	doc, ok := head.Data[ValuesKey]
	if !ok {
		return nil, fmt.Errorf("ConfigMap has no data key %q", ValuesKey)
	}
	return []byte(doc), nil
}

// ReadValuesDocument reads the values.yaml document of a file holding one,
// or holding a ConfigMap manifest with one.
func ReadValuesDocument(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	doc, err := ValuesDocument(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return doc, nil
}

// MergeA returns (A), the os_images a workload cluster's chart sees
// (contract §5): info, the os_images of the namespace's os-images-info
// ConfigMap (the HelmRelease's valuesFrom; nil when there is none), with
// the cluster values' own os_images merged on top, as Flux merges a
// HelmRelease's inline values over its valuesFrom: image by image, and
// field by field within an image (maps merge, any other value, a null
// included, replaces). Render, select, the fleet check and plan all take
// (A) from here, so that they cannot disagree on it.
//
// The result is nil when there is neither an info catalog nor os_images in
// the values; it shares nothing with its inputs.
func MergeA(info Catalog, clusterValues map[string]any) (Catalog, error) {
	raw, present := clusterValues["os_images"]
	if !present {
		return info.Clone(), nil
	}
	inline, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf(".os_images: must be a map of image key to image fields, got %s (it replaces the whole os-images-info catalog)", Describe(raw))
	}
	out := info.Clone()
	if out == nil {
		out = Catalog{}
	}
	for _, key := range slices.Sorted(maps.Keys(inline)) {
		switch entry := inline[key].(type) {
		case nil:
			out[key] = nil
		case map[string]any:
			if base := out[key]; base != nil {
				out[key] = Image(values.Overlay(base, entry))
			} else {
				out[key] = Image(entry).Clone()
			}
		default:
			return nil, fmt.Errorf(".os_images.%s: must be a map of image fields, got %s", key, Describe(entry))
		}
	}
	return out, nil
}

// Clone returns a deep copy of c; nil stays nil.
func (c Catalog) Clone() Catalog {
	if c == nil {
		return nil
	}
	out := make(Catalog, len(c))
	for k, img := range c {
		out[k] = img.Clone()
	}
	return out
}
