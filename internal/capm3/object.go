package capm3

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// hashLen is how many hex digits of the spec hash end a template name:
// 40 bits, so a collision between two specs of one cluster is out of reach,
// and names stay short.
const hashLen = 10

// specHash hashes the spec alone. Labels and annotations stay out: a
// change to them must not roll machines (cluster-api#5413). encoding/json
// writes map keys sorted, so the hash depends on neither map order nor
// process.
func specHash(spec map[string]any) (string, error) {
	data, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("hashing the template spec: %w", err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:hashLen], nil
}

// CatalogsFromValues reads (A) and (B) where sylva-capi-cluster expects
// them in a cluster's values: os_images and capm3_os_image_server_images.
// (A) is the values' own os_images alone; with the cluster's os-images-info,
// it is osimage.MergeA of it and the values.
func CatalogsFromValues(v values.Values) (osimage.Catalog, osimage.ServedSet, error) {
	a, err := osimage.MergeA(nil, v)
	if err != nil {
		return nil, nil, err
	}
	served, err := values.Map(v, "capm3_os_image_server_images", ".capm3_os_image_server_images")
	if err != nil {
		return nil, nil, err
	}
	// Going through the document form reuses its strict schema: an entry
	// with a field the consumer does not know is refused here too.
	doc, err := yaml.Marshal(map[string]any{"capm3_os_image_server_images": served})
	if err != nil {
		return nil, nil, fmt.Errorf(".capm3_os_image_server_images: %w", err)
	}
	b, err := osimage.ParseServed(doc)
	if err != nil {
		return nil, nil, fmt.Errorf(".capm3_os_image_server_images: %w", err)
	}
	return a, b, nil
}
