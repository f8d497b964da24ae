package osimage

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"

	"sigs.k8s.io/yaml"
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

type infoDocument struct {
	OSImages Catalog `json:"os_images"`
}

// MarshalInfo renders the values.yaml document of os-images-info. Map keys
// come out sorted, so equal catalogs give equal bytes.
func MarshalInfo(c Catalog) ([]byte, error) {
	if c == nil {
		c = Catalog{}
	}
	return yaml.Marshal(infoDocument{OSImages: c})
}

// ParseInfo reads the values.yaml document of an os-images-info ConfigMap.
// Scalars of any YAML type are accepted and kept as their string form, since
// hand-written documents often leave numbers and booleans unquoted.
func ParseInfo(data []byte) (Catalog, error) {
	var doc struct {
		OSImages map[string]any `json:"os_images"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing os_images document: %w", err)
	}
	return CatalogFromValues(doc.OSImages, "os_images")
}

// CatalogFromValues converts a generic os_images map, as found in values,
// into a Catalog. path names the map in error messages.
func CatalogFromValues(m map[string]any, path string) (Catalog, error) {
	out := make(Catalog, len(m))
	for _, key := range slices.Sorted(maps.Keys(m)) {
		fields, ok := m[key].(map[string]any)
		if !ok && m[key] != nil {
			return nil, fmt.Errorf("%s.%s: must be a map of image fields, got %T", path, key, m[key])
		}
		img := make(Image, len(fields))
		for _, f := range slices.Sorted(maps.Keys(fields)) {
			s, err := ScalarString(fields[f])
			if err != nil {
				return nil, fmt.Errorf("%s.%s.%s: %w", path, key, f, err)
			}
			img[f] = s
		}
		out[key] = img
	}
	return out, nil
}

// ScalarString returns the string form of a YAML scalar: strings as they
// are, booleans as "true"/"false", numbers in decimal. Maps and lists are
// refused.
func ScalarString(v any) (string, error) {
	switch t := v.(type) {
	case string:
		return t, nil
	case bool:
		return strconv.FormatBool(t), nil
	case int:
		return strconv.Itoa(t), nil
	case int64:
		return strconv.FormatInt(t, 10), nil
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64), nil
	case nil:
		return "", nil
	default:
		return "", fmt.Errorf("must be a string, got a %T", v)
	}
}

// ServedImage is one entry of capm3_os_image_server_images.
type ServedImage struct {
	Available bool   `json:"available"`
	ImageKey  string `json:"image_key"`
}

// ServedSet is capm3_os_image_server_images: image sha256 -> entry.
type ServedSet map[string]ServedImage

type servedDocument struct {
	Images ServedSet `json:"capm3_os_image_server_images"`
}

// MarshalServed renders the values.yaml document of the served-images
// ConfigMap.
func MarshalServed(s ServedSet) ([]byte, error) {
	if s == nil {
		s = ServedSet{}
	}
	return yaml.Marshal(servedDocument{Images: s})
}

// ParseServed reads the values.yaml document of the served-images ConfigMap.
// Unknown entry fields are refused, as the consumer's schema does.
func ParseServed(data []byte) (ServedSet, error) {
	var doc servedDocument
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("parsing capm3_os_image_server_images document: %w", err)
	}
	if doc.Images == nil {
		doc.Images = ServedSet{}
	}
	return doc.Images, nil
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
