// Package levels reads how a cluster's values designate the image of each
// of its levels (the control plane, each machine deployment), as
// sylva-capi-cluster does: it merges the capm3 maps that apply to each
// level, reads what finalizing a selector takes from the cluster, and gives
// each level's image_key and finalized os_image_selector (a Choice), or the
// image a level picks from a catalog (Picks).
//
// The renderer (capm3), the image server's selection and the fleet check
// all read levels with it, so that they pick alike; none of them needs the
// renderer to read values.
package levels

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

// Level is the merged capm3 values of one template.
type Level struct {
	// Path is the level's values path, for error messages:
	// .control_plane.capm3 or .machine_deployments.NAME.capm3.
	Path string
	// MachineDeployment is the machine deployment's name, empty for the
	// control plane.
	MachineDeployment string
	// Values are the capm3 maps that apply to the level, merged, most
	// general first.
	Values values.Values
}

// Split deep-merges, for each template, the capm3 maps that apply to it,
// most general first: the control plane's level, then one per machine
// deployment in name order.
func Split(v values.Values) ([]Level, []error) {
	var errs []error
	root, err := values.Map(v, "capm3", ".capm3")
	if err != nil {
		errs = append(errs, err)
	}
	sub := func(parent values.Values, key, path string) values.Values {
		m, err := values.Map(parent, key, path)
		if err != nil {
			errs = append(errs, err)
		}
		return m
	}
	cp := sub(sub(v, "control_plane", ".control_plane"), "capm3", ".control_plane.capm3")
	mdDefault := sub(sub(v, "machine_deployment_default", ".machine_deployment_default"), "capm3", ".machine_deployment_default.capm3")
	mds := sub(v, "machine_deployments", ".machine_deployments")

	// The levels merge as sylva-library's mergeOverwrite merges them: a
	// null in a more specific level is kept (and, as a pattern, refused).
	out := []Level{{Path: ".control_plane.capm3", Values: values.Overlay(root, cp)}}
	names := make([]string, 0, len(mds))
	for name, md := range mds {
		// A null machine deployment is one removed by a later values
		// file, as Helm does.
		if md != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	mdBase := values.Overlay(root, mdDefault)
	for _, name := range names {
		path := ".machine_deployments." + name
		own := sub(sub(mds, name, path), "capm3", path+".capm3")
		out = append(out, Level{Path: path + ".capm3", MachineDeployment: name, Values: values.Overlay(mdBase, own)})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

// Finalization reads what finalizing a selector takes from the cluster's
// values. They are used as written, never re-formatted: a k8s_version
// written as the number 1.30 is refused, not read as "1.3".
func Finalization(v values.Values) (selector.Cluster, error) {
	var c selector.Cluster
	var errs []error
	str := func(m values.Values, key, path string) string {
		switch t := m[key].(type) {
		case nil:
			return ""
		case string:
			return t
		default:
			errs = append(errs, fmt.Errorf("%s: must be a string (quote it), got %s", path, osimage.Describe(t)))
			return ""
		}
	}
	c.K8sVersion = str(v, "k8s_version", ".k8s_version")
	_, c.K8sVersionSet = v["k8s_version"].(string)
	if providers, err := values.Map(v, "capi_providers", ".capi_providers"); err != nil {
		errs = append(errs, err)
	} else {
		c.BootstrapProvider = str(providers, "bootstrap_provider", ".capi_providers.bootstrap_provider")
	}
	// Sylva takes the registries pattern with `default ".*"`: a value that
	// is not set in a template's sense is the default; a boolean is a
	// pattern like any selector value.
	switch t := v["os_image_selector_autoselect_registries"].(type) {
	case bool:
		if t {
			c.AutoselectRegistries = "true"
		}
	default:
		if IsSet(t) {
			c.AutoselectRegistries = str(v, "os_image_selector_autoselect_registries", ".os_image_selector_autoselect_registries")
		}
	}
	return c, errors.Join(errs...)
}

// IsSet says whether a value counts as set where Sylva's templates test it
// with `if`: null, false, "", 0 and an empty map or list do not. So
// `os_image_selector: {}` (or false, or null) leaves a level without a
// selector, at any level and after the levels are merged, exactly as
// sylva-library's `if $def.os_image_selector` has it.
func IsSet(v any) bool {
	switch t := v.(type) {
	case nil:
		return false
	case bool:
		return t
	case string:
		return t != ""
	case float64:
		return t != 0
	case int:
		return t != 0
	case int64:
		return t != 0
	case map[string]any:
		return len(t) > 0
	case []any:
		return len(t) > 0
	}
	return true
}

// Choice is how one level designates its image in (A).
type Choice struct {
	// ImageKey is the level's image_key, empty when unset.
	ImageKey string
	// Selector is the level's os_image_selector, finalized; nil when unset.
	Selector *selector.Selector
	// values are the level's, for what else a pick reads of it.
	values values.Values
}

// IsSet says whether the level designates an image in (A) at all.
func (c Choice) IsSet() bool { return c.ImageKey != "" || c.Selector != nil }

// Choice reads how the level designates its image in (A), as Sylva's
// compute-image-key does: the os_image_selector, when set, finalized for
// the cluster (c, or finalizeErr when the cluster's values for it are
// wrong, see Finalization); the image_key, when set.
func (lv Level) Choice(c selector.Cluster, finalizeErr error) (Choice, error) {
	choice := Choice{values: lv.Values}
	rawSel := lv.Values["os_image_selector"]
	switch raw := lv.Values["image_key"].(type) {
	case nil:
	case string:
		choice.ImageKey = raw
	default:
		// Beside a selector, Sylva only compares an image_key that is set
		// (so false or 0 is ignored there); alone, it would use whatever
		// the value prints as. A key is a string: anything else is
		// refused, not re-formatted.
		if !IsSet(rawSel) || IsSet(raw) {
			return Choice{}, fmt.Errorf("%s.image_key: must be the key of an image in os_images, got %s", lv.Path, osimage.Describe(raw))
		}
	}
	if raw := rawSel; IsSet(raw) {
		s, err := selector.Parse(raw, lv.Path+".os_image_selector")
		if err != nil {
			return Choice{}, err
		}
		if finalizeErr != nil {
			return Choice{}, fmt.Errorf("%s.os_image_selector: cannot be completed for the cluster: %w", lv.Path, finalizeErr)
		}
		if s, err = selector.Finalize(s, c); err != nil {
			return Choice{}, fmt.Errorf("%s.os_image_selector: %w", lv.Path, err)
		}
		choice.Selector = &s
	}
	return choice, nil
}

// ChoiceAt returns the image_key and finalized selector that rendering
// uses for the level at path (.control_plane.capm3 or
// .machine_deployments.NAME.capm3), so that tools can show what a level
// would pick. A level that designates no image in (A) (it gives its image
// by hand, or none) has a Choice that is not set.
func ChoiceAt(v values.Values, path string) (Choice, error) {
	fc, ferr := Finalization(v)
	lvs, errs := Split(v)
	var paths []string
	for _, lv := range lvs {
		if lv.Path == path {
			return lv.Choice(fc, ferr)
		}
		paths = append(paths, lv.Path)
	}
	if len(errs) > 0 {
		return Choice{}, errors.Join(errs...)
	}
	return Choice{}, fmt.Errorf("level %q: no such level in the cluster values (levels: %s)", path, strings.Join(paths, ", "))
}

// Choices returns the choice of every level that designates its image in
// (A), keyed by level path; levels that give their image by hand have
// none. The error joins the faults of the other levels.
func Choices(v values.Values) (map[string]Choice, error) {
	fc, ferr := Finalization(v)
	lvs, errs := Split(v)
	choices := map[string]Choice{}
	for _, lv := range lvs {
		c, err := lv.Choice(fc, ferr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if c.IsSet() {
			choices[lv.Path] = c
		}
	}
	return choices, errors.Join(errs...)
}

// Pick is the image one level picks from (A).
type Pick struct {
	// Level is the values path of the level.
	Level    string
	ImageKey string
	// SHA256 and Filename are where render serves it from:
	// /images/<sha256>/<filename>; Filename is "" when the level takes it
	// by oci:// (Delivery), whose URL names no file.
	SHA256   osimage.SHA256
	Filename string
	// Delivery is how render gives it to Metal3: DeliveryHTTP or
	// DeliveryOCI.
	Delivery string
}

// How a level's image reaches Metal3 (.image_delivery).
const (
	// DeliveryHTTP: the image URL, with its sha256 as checksum (default).
	DeliveryHTTP = "http"
	// DeliveryOCI: oci://<host>/images/<sha256>:<disk type>, which
	// BareMetalOperator 0.12 and Ironic 29 take from the server's OCI
	// distribution API (osimage.OCIReference).
	DeliveryOCI = "oci"
	// DeliveryOCIDigest is no value of .image_delivery but what a Metal3
	// object may still hold from an earlier render:
	// oci://<host>/images/<sha256>@<manifest digest>, of a disk format
	// Ironic cannot tell. A render of oci replaces it (the nodes roll).
	DeliveryOCIDigest = "oci-digest"
)

// Delivery reads a level's .image_delivery: http (the default) or oci.
func Delivery(v values.Values, path string) (string, error) {
	d, err := values.String(v, "image_delivery", path+".image_delivery")
	switch {
	case err != nil:
		return "", err
	case d == "":
		return DeliveryHTTP, nil
	case d != DeliveryHTTP && d != DeliveryOCI:
		return "", fmt.Errorf("%s.image_delivery: must be http (image URLs with a checksum) or oci (oci:// URLs, for BareMetalOperator 0.12 and CAPM3 1.14.0 and later), got %q", path, d)
	}
	return d, nil
}

// Picks returns, in level order, the image that each level designating
// one in (A) picks, exactly as rendering would, but without the served
// check: they are what the cluster needs the management cluster to serve.
// A picked image that render would refuse to serve (osimage's served-image
// rule: no or a malformed sha256 or filename) is no pick: it is a fault of
// its level, as render reports it. The error joins the faults of the
// levels that cannot pick.
func Picks(v values.Values, catalog osimage.Catalog) ([]Pick, error) {
	choices, err := Choices(v)
	errs := []error{err}
	var out []Pick
	for _, path := range slices.Sorted(maps.Keys(choices)) {
		c := choices[path]
		key, err := selector.Resolve(catalog, c.ImageKey, c.Selector, path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sha, filename, err := catalog[key].ServedAt(path + ": os_images." + key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		delivery, err := Delivery(c.values, path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if delivery == DeliveryOCI {
			filename = ""
		}
		out = append(out, Pick{Level: path, ImageKey: key, SHA256: sha, Filename: filename, Delivery: delivery})
	}
	return out, errors.Join(errs...)
}
