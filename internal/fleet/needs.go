// Package fleet holds what the management cluster knows about the images
// its workload clusters need: which images a cluster uses or will use
// (its Metal3 templates and the picks of its own values and catalog),
// whether the management cluster serves them, and what a proposed change
// of the management values would do to each cluster.
//
// It is pure but for Read, which lists what a namespace holds for the
// check controller (from its cache) and the plan command (from the
// apiserver), so that both read a namespace the same way.
package fleet

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/opencontainers/go-digest"
	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// Need is one image that a workload cluster uses or will use.
type Need struct {
	SHA256 osimage.SHA256
	// ImageKey is the image's key in the cluster's own catalog, when known.
	ImageKey string
	// Filename is the filename its URL asks for (/images/<sha256>/<filename>),
	// "" when the URL is not the image server's.
	Filename string
	// By says who needs it: a Metal3 object, or a level of a cluster's
	// values.
	By string
	// Delivery is how it reaches Metal3 (levels.DeliveryHTTP, DeliveryOCI,
	// or for a Metal3 object DeliveryOCIDigest): the kind of URL a Metal3 object holds, or the one a
	// level's values render; Live says which of the two the need is.
	Delivery string
	Live     bool
	// Manifest is the manifest digest a Metal3 object's oci:// URL asks
	// for, "" otherwise.
	Manifest digest.Digest
}

// ClusterValues is one cluster's values, from a ConfigMap labelled
// osimages.sylva-project.org/cluster-values.
type ClusterValues struct {
	// Source names where the values were read, such as ConfigMap NS/NAME.
	Source string
	Values values.Values
}

// Inputs is what one workload-cluster namespace holds.
type Inputs struct {
	Namespace string
	// Clusters are the cluster values found in the namespace.
	Clusters []ClusterValues
	// Catalog is (A), the namespace's own os-images-info; nil when absent.
	Catalog osimage.Catalog
	// Objects are its Metal3MachineTemplates and Metal3Machines.
	Objects []*unstructured.Unstructured
	// Unreadable is what could not be read while gathering the rest
	// (a ConfigMap that does not parse); Needs reports it.
	Unreadable error
	// OCIRefused is why the installed CAPM3 refuses templates whose image
	// is given by oci:// (metal3.ReadOCIRefusal), nil when it accepts them
	// or is not known: a level of cluster values that asks for oci://
	// delivery is then an error of Needs.
	OCIRefused error
}

// Needs returns the images the namespace's clusters need: those its Metal3
// objects reference, and those its cluster values pick from its own
// catalog, (A) as render sees it (osimage.MergeA: the values' own
// os_images merged over os-images-info). The error lists what could not be
// worked out, such as a level that picks no image; the needs found are
// returned all the same.
func Needs(in Inputs) ([]Need, error) {
	var needs []Need
	errs := []error{in.Unreadable}
	for _, obj := range in.Objects {
		img, ok := metal3.ImageOf(obj)
		if !ok {
			continue
		}
		sha, ok := img.SHA256()
		if !ok {
			continue // an image given by hand, not served by osimages
		}
		var filename string
		if urlSHA, name, ok := img.ServedFile(); ok && urlSHA == sha {
			filename = name
		}
		delivery, manifest := levels.DeliveryHTTP, digest.Digest("")
		if oci, ok := osimage.ParseOCIReference(img.URL); ok {
			delivery, manifest = levels.DeliveryOCI, oci.Manifest
			if manifest != "" {
				delivery = levels.DeliveryOCIDigest
			}
		}
		ref := metal3.Ref{Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName()}
		needs = append(needs, Need{SHA256: sha, ImageKey: in.Catalog.KeyOf(sha, ""), Filename: filename, By: ref.String(), Delivery: delivery, Live: true, Manifest: manifest})
	}
	for _, c := range in.Clusters {
		cat, err := osimage.MergeA(in.Catalog, c.Values)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Source, err))
			continue
		}
		if cat == nil {
			errs = append(errs, fmt.Errorf("%s: the namespace has no %s ConfigMap and the values no os_images, so no image can be picked; publish the cluster's catalog (a ConfigMap labelled %s)", c.Source, osimage.InfoConfigMapName, CatalogValuesLabel))
			continue
		}
		picks, err := levels.Picks(c.Values, cat)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Source, err))
		}
		for _, p := range picks {
			if p.Delivery == levels.DeliveryOCI && in.OCIRefused != nil {
				errs = append(errs, fmt.Errorf("%s %s.image_delivery: oci: %w", c.Source, p.Level, in.OCIRefused))
			}
			needs = append(needs, Need{SHA256: p.SHA256, ImageKey: p.ImageKey, Filename: p.Filename, By: c.Source + " " + p.Level, Delivery: p.Delivery})
		}
	}
	return needs, errors.Join(errs...)
}

// Labels of the ConfigMaps the fleet controller reads.
const (
	// ClusterValuesLabel marks a ConfigMap holding a workload cluster's
	// values (sylva-capi-cluster's) under values.yaml.
	ClusterValuesLabel = "osimages.sylva-project.org/cluster-values"
	// CatalogValuesLabel marks a ConfigMap holding catalog inputs
	// (sylva-units values) under values.yaml; the catalog of the namespace
	// is published beside it as os-images-info.
	CatalogValuesLabel = "osimages.sylva-project.org/catalog-values"
)

// group gathers needs by sha256, in sha256 order, each with its sorted
// list of who needs it.
func group(needs []Need) []osimage.ImageStatus {
	by := map[osimage.SHA256]*osimage.ImageStatus{}
	for _, n := range needs {
		st := by[n.SHA256]
		if st == nil {
			st = &osimage.ImageStatus{SHA256: n.SHA256}
			by[n.SHA256] = st
		}
		if st.ImageKey == "" {
			st.ImageKey = n.ImageKey
		}
		if !slices.Contains(st.NeededBy, n.By) {
			st.NeededBy = append(st.NeededBy, n.By)
		}
		if n.Filename != "" && !slices.Contains(st.Filenames, n.Filename) {
			st.Filenames = append(st.Filenames, n.Filename)
		}
		if n.Manifest != "" && !slices.Contains(st.Manifests, n.Manifest) {
			st.Manifests = append(st.Manifests, n.Manifest)
		}
	}
	out := make([]osimage.ImageStatus, 0, len(by))
	for _, st := range by {
		slices.Sort(st.NeededBy)
		slices.Sort(st.Filenames)
		slices.Sort(st.Manifests)
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b osimage.ImageStatus) int { return cmp.Compare(a.SHA256, b.SHA256) })
	return out
}
