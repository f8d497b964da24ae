package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// The fleet's needs, published by the controller in the management
// cluster's namespace for the image server (issue "fleet-driven serving"):
// the server never reads workload namespaces, only this one document.
const (
	// FleetNeedsConfigMapName is the ConfigMap's default name.
	FleetNeedsConfigMapName = "osimages-fleet-needs"
	// FleetNeedsKey is its data key.
	FleetNeedsKey = "needs.yaml"
)

// FleetNeeds is every image some workload cluster needs, by sha256.
type FleetNeeds struct {
	Images []FleetNeed `json:"images"`
}

// FleetNeed is one needed image and where it comes from.
type FleetNeed struct {
	SHA256 string `json:"sha256"`
	// Sources are the records of the needing namespaces' own catalogs,
	// one per distinct record (two namespaces may name one sha256 under
	// other keys, URIs or registries), each with the namespaces that give
	// it. A need whose record no catalog holds (a Metal3 object naming an
	// image its catalog no longer lists) has no source: nothing says where
	// its bytes are.
	Sources []NeedSource `json:"sources,omitempty"`
	// Namespaces are all the namespaces that need it, sorted.
	Namespaces []string `json:"namespaces"`
}

// NeedSource is one record of a needed image, as os-images-info holds it.
type NeedSource struct {
	// Key is the image's key in those namespaces' os-images-info.
	Key        string        `json:"key"`
	Image      osimage.Image `json:"image"`
	Namespaces []string      `json:"namespaces"`
}

// NamespaceNeeds is what one namespace contributes: the check's report of
// it and its own catalog (A), nil when it has none.
type NamespaceNeeds struct {
	Report  Report
	Catalog osimage.Catalog
}

// Aggregate gathers the needs of every namespace into the fleet's, sorted
// by sha256, so that the same fleet always gives the same document. A
// record is taken only when its sha256 is the one needed: a catalog
// cannot make a need point at other bytes.
func Aggregate(namespaces []NamespaceNeeds) FleetNeeds {
	type source struct {
		key, doc string
		image    osimage.Image
		ns       []string
	}
	type gathered struct {
		ns      []string
		sources []*source
	}
	bySHA := map[string]*gathered{}
	for _, n := range namespaces {
		ns := n.Report.Namespace
		for _, img := range n.Report.Images {
			need := bySHA[img.SHA256]
			if need == nil {
				need = &gathered{}
				bySHA[img.SHA256] = need
			}
			if !slices.Contains(need.ns, ns) {
				need.ns = append(need.ns, ns)
			}
			key, rec, ok := recordOf(n.Catalog, img)
			if !ok {
				continue
			}
			doc, _ := yaml.Marshal(rec)
			i := slices.IndexFunc(need.sources, func(s *source) bool { return s.key == key && s.doc == string(doc) })
			if i < 0 {
				need.sources = append(need.sources, &source{key: key, doc: string(doc), image: rec})
				i = len(need.sources) - 1
			}
			if s := need.sources[i]; !slices.Contains(s.ns, ns) {
				s.ns = append(s.ns, ns)
			}
		}
	}
	out := FleetNeeds{Images: []FleetNeed{}}
	for _, sha := range slices.Sorted(maps.Keys(bySHA)) {
		need := bySHA[sha]
		fn := FleetNeed{SHA256: sha, Namespaces: slices.Sorted(slices.Values(need.ns))}
		slices.SortFunc(need.sources, func(a, b *source) int {
			if c := strings.Compare(a.key, b.key); c != 0 {
				return c
			}
			return strings.Compare(a.doc, b.doc)
		})
		for _, s := range need.sources {
			fn.Sources = append(fn.Sources, NeedSource{Key: s.key, Image: s.image, Namespaces: slices.Sorted(slices.Values(s.ns))})
		}
		out.Images = append(out.Images, fn)
	}
	return out
}

// recordOf finds the catalog record of a needed image: under the key the
// check found, else under any key with that sha256.
func recordOf(cat osimage.Catalog, img ImageStatus) (string, osimage.Image, bool) {
	if rec, ok := cat[img.ImageKey]; ok && rec.Get(osimage.FieldSHA256) == img.SHA256 {
		return img.ImageKey, rec, true
	}
	for _, k := range cat.Keys() {
		if cat[k].Get(osimage.FieldSHA256) == img.SHA256 {
			return k, cat[k], true
		}
	}
	return "", nil, false
}

// Data is the ConfigMap data of the fleet's needs. It refuses, with an
// osimage.SizeError, needs that a ConfigMap cannot hold.
func (f FleetNeeds) Data(what string) (map[string]string, error) {
	doc, err := yaml.Marshal(f)
	if err != nil {
		return nil, err
	}
	data := map[string]string{FleetNeedsKey: string(doc)}
	if err := osimage.CheckConfigMapSize(what, data, len(f.Images)); err != nil {
		return nil, err
	}
	return data, nil
}

// ParseFleetNeeds reads the document back, refusing unknown fields and a
// need without a well-formed sha256.
func ParseFleetNeeds(data string) (FleetNeeds, error) {
	var f FleetNeeds
	if err := yaml.UnmarshalStrict([]byte(data), &f); err != nil {
		return FleetNeeds{}, fmt.Errorf("%s: %w", FleetNeedsKey, err)
	}
	for _, img := range f.Images {
		if _, err := osimage.ParseSHA256(img.SHA256); err != nil {
			return FleetNeeds{}, fmt.Errorf("%s: %w", FleetNeedsKey, err)
		}
	}
	return f, nil
}
