// Package servedset computes the served set: the images of the management
// cluster's catalog that its own levels designate (finalized as render
// finalizes them) or that one of its additional selectors matches, each
// with every filename its sha256 is known by. The image server serves that
// set; plan and the demo compute it the same way.
package servedset

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

// Wanted is one image of the served set: one the server must serve.
type Wanted struct {
	SHA256 osimage.SHA256
	// Key is the image's key in the management cluster's os_images; when
	// several keys name the same file, the first in sort order.
	Key string
	// Desc is what is read of Key's record, parsed once when selected.
	Desc osimage.Descriptor
	// SelectedBy names the selectors that matched it, for operators.
	SelectedBy []string
	// Filenames are every filename that a key of the management os_images
	// gives this sha256, sorted: the one stored file is served under each,
	// so that a second key with another filename never moves a URL.
	Filenames []string
	// Records, for an image served because workload clusters need it
	// (FleetNeeds), are every admitted record of its bytes in the order a
	// download tries them; Key and Image are the first. A download that
	// fails from one record tries the next, so that no record blocks the
	// image for the namespaces of the others.
	Records []Record
	// ForNamespaces are the namespaces a fleet need is served for; nil for
	// the management selection, which is downloaded first and never gives
	// its room to a need.
	ForNamespaces []string
}

// Record is one record of an image's bytes, from a needing namespace's
// catalog.
type Record struct {
	Key  string
	Desc osimage.Descriptor
	// Namespaces are those whose catalog gives this record.
	Namespaces []string
}

// IsNeed says whether w is served only because workload clusters need it.
func (w Wanted) IsNeed() bool { return len(w.ForNamespaces) > 0 }

// Use makes rec the record w is downloaded from.
func (w *Wanted) Use(rec Record) { w.Key, w.Desc = rec.Key, rec.Desc }

// Bounds returns the most bytes w's file may have and what its download
// reserves on disk (osimage.Descriptor.DiskCost). A malformed size or
// manifest digest (osimage.Descriptor.Err) and a size above maxImageSize
// are refused: the download, before any byte, not the selection.
func (w Wanted) Bounds(maxImageSize int64) (bound, need int64, err error) {
	if w.Desc.Err != nil {
		return 0, 0, fmt.Errorf("os_images.%s.%w", w.Key, w.Desc.Err)
	}
	if size := w.Desc.Size; size > maxImageSize {
		return 0, 0, fmt.Errorf("os_images.%s.size is %s (%d bytes), more than --max-image-size %s; raise --max-image-size if the image really is that large",
			w.Key, osimage.FormatBytes(size), size, osimage.FormatBytes(maxImageSize))
	}
	return w.Desc.Bound(maxImageSize), w.Desc.DiskCost(maxImageSize), nil
}

// ServedAs returns the filenames the image is served under: Filenames, or
// the record's own filename for an image known only from the store.
func (w Wanted) ServedAs() []string {
	if len(w.Filenames) > 0 {
		return w.Filenames
	}
	if w.Desc.Filename != "" {
		return []string{w.Desc.Filename}
	}
	return nil
}

// AdditionalSelectorsKey names the map of extra selectors in the management
// values: name -> selector, used as written (not finalized).
const AdditionalSelectorsKey = "os_image_server_additional_selectors"

// Select computes the served set: every image of cat that one of the
// management cluster's own finalized level selectors (or image_key) designates,
// or that an additional selector matches. It returns what it could select
// together with the faults of the rest, so that one bad selector never stops
// the images of the others from being served. Images that cannot be served
// (no sha256 or filename) are faults too. Each image selected is served
// under every filename that a key of cat gives its sha256, selected or not:
// it is the same file.
func Select(mgmt values.Values, cat osimage.Catalog) (map[osimage.SHA256]Wanted, error) {
	var errs []error
	byKey := map[string][]string{}
	add := func(key, by string) { byKey[key] = append(byKey[key], by) }

	choices, err := levels.Choices(mgmt)
	if err != nil {
		errs = append(errs, err)
	}
	for _, path := range slices.Sorted(maps.Keys(choices)) {
		c := choices[path]
		if c.Selector != nil {
			keys, err := c.Selector.Select(cat)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", path, err))
				continue
			}
			for _, key := range keys {
				if c.ImageKey == "" || c.ImageKey == key {
					add(key, path)
				}
			}
			continue
		}
		if _, ok := cat[c.ImageKey]; !ok {
			errs = append(errs, fmt.Errorf("%s: nothing in os_images for image_key %s", path, c.ImageKey))
			continue
		}
		add(c.ImageKey, path)
	}

	extra, err := values.Map(mgmt, AdditionalSelectorsKey, "."+AdditionalSelectorsKey)
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range slices.Sorted(maps.Keys(extra)) {
		path := "." + AdditionalSelectorsKey + "." + name
		sel, err := selector.Parse(extra[name], path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		keys, err := sel.Select(cat)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		for _, key := range keys {
			add(key, path)
		}
	}

	// Each entry's sha256 is parsed once: for the selected images, and for
	// the filenames every entry of the same image adds.
	shas := make(map[string]osimage.SHA256, len(cat))
	shaErrs := map[string]error{}
	for key, img := range cat {
		if sha, err := img.SHA256(); err != nil {
			shaErrs[key] = err
		} else {
			shas[key] = sha
		}
	}
	out := map[osimage.SHA256]Wanted{}
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		img := cat[key]
		sha, err := shas[key], shaErrs[key]
		if err != nil {
			errs = append(errs, fmt.Errorf("os_images.%s: cannot be served: it has no valid sha256: %w", key, err))
			continue
		}
		if _, err := img.Filename(); err != nil {
			errs = append(errs, fmt.Errorf("os_images.%s: cannot be served: %w", key, err))
			continue
		}
		if prev, ok := out[sha]; ok {
			prev.SelectedBy = append(prev.SelectedBy, byKey[key]...)
			out[sha] = prev
			continue
		}
		out[sha] = Wanted{SHA256: sha, Key: key, Desc: img.Descriptor(), SelectedBy: byKey[key]}
	}
	for _, key := range cat.Keys() {
		sha, ok := shas[key]
		if !ok {
			continue
		}
		w, ok := out[sha]
		name, err := cat[key].Filename()
		if !ok || err != nil || slices.Contains(w.Filenames, name) {
			continue
		}
		w.Filenames = append(w.Filenames, name)
		slices.Sort(w.Filenames)
		out[sha] = w
	}
	return out, errors.Join(errs...)
}

// ValuesNearMisses reports the near-misses (values.NearMiss) of the keys
// selection and the signature policy read in the management values: at the
// top, in each capm3 level (os_image_selector, image_key), and those of
// os_images_oci_registries and security. A misspelt
// os_image_server_additional_selectors would otherwise silently drop every
// image it selects.
func ValuesNearMisses(mgmt values.Values) []error {
	errs := values.NearMisses(mgmt, "", AdditionalSelectorsKey, "capm3", "control_plane", "machine_deployment_default",
		"machine_deployments", "k8s_version", "capi_providers", "os_image_selector_autoselect_registries")
	level := func(m any, path string) {
		if lv, ok := m.(map[string]any); ok {
			errs = append(errs, values.NearMisses(lv, path, "os_image_selector", "image_key")...)
		}
	}
	holder := func(m any, path string) {
		if h, ok := m.(map[string]any); ok {
			errs = append(errs, values.NearMisses(h, path, "capm3")...)
			level(h["capm3"], path+".capm3")
		}
	}
	level(mgmt["capm3"], ".capm3")
	holder(mgmt["control_plane"], ".control_plane")
	holder(mgmt["machine_deployment_default"], ".machine_deployment_default")
	if mds, ok := mgmt["machine_deployments"].(map[string]any); ok {
		for _, name := range slices.Sorted(maps.Keys(mds)) {
			holder(mds[name], ".machine_deployments."+name)
		}
	}
	return append(errs, catalog.TrustNearMisses(mgmt)...)
}
