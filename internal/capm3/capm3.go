// Package capm3 renders the Metal3MachineTemplates of one cluster from its
// values (contract §5): it splits the values into levels (control plane,
// each machine deployment), picks each level's image from the cluster's own
// catalog (A), checks that the management cluster serves it (B), and names
// each template by a hash of its spec.
//
// It is pure: no Kubernetes client, no clock, no randomness, so the same
// values and catalog always give the same bytes (contract §8).
package capm3

import (
	"errors"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

// The object kind rendered, and the API versions it can be rendered in.
const (
	Kind    = "Metal3MachineTemplate"
	Group   = "infrastructure.cluster.x-k8s.io"
	V1Beta1 = Group + "/v1beta1"
	V1Beta2 = Group + "/v1beta2"
	// DefaultAPIVersion is what Sylva's chart renders today.
	DefaultAPIVersion = V1Beta1
)

// Input is everything a rendering depends on.
type Input struct {
	// Values are the cluster's merged values (sylva-capi-cluster's).
	Values values.Values
	// Catalog is (A), the cluster's own os_images: the only source of the
	// image picked.
	Catalog osimage.Catalog
	// Served is (B), what the management cluster's image server serves:
	// only checked against, never picked from.
	Served osimage.ServedSet
	// APIVersion is V1Beta1 (when empty) or V1Beta2; "v1beta1" and
	// "v1beta2" are accepted too.
	APIVersion string
	// Namespace, when set, goes into each object's metadata.
	Namespace string
}

// Template is one rendered Metal3MachineTemplate.
type Template struct {
	// Level is the values path of the level it was rendered from, such as
	// .control_plane.capm3 or .machine_deployments.md0.capm3.
	Level string
	// MachineDeployment is the machine deployment's name, empty for the
	// control plane.
	MachineDeployment string
	// ImageKey is the key in (A) of the image picked, empty when the level
	// gave its image by hand.
	ImageKey string
	// Object is the object, as YAML decoding would give it.
	Object map[string]any
}

// Name returns the object's metadata.name.
func (t Template) Name() string {
	md, _ := t.Object["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	return name
}

// Render returns the control plane's template, then one per machine
// deployment in name order. Every failing level is reported in the one
// error, so that an operator fixes them all in one go; on any error no
// template is returned, so nothing half-rendered can be applied.
func Render(in Input) ([]Template, error) {
	apiVersion, err := normalizeAPIVersion(in.APIVersion)
	if err != nil {
		return nil, err
	}
	cl, errs := readCluster(in.Values)
	// Only rendering needs the name: picking images (the server's
	// selection, the fleet check) does not.
	if name, err := values.String(in.Values, "name", ".name"); err == nil && name == "" {
		errs = append(errs, errors.New(".name: the cluster name must be set: it starts every template name"))
	}
	if in.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(in.Namespace) {
			errs = append(errs, fmt.Errorf("namespace %q: %s", in.Namespace, msg))
		}
	}
	levels, lerrs := splitLevels(in.Values)
	errs = append(errs, lerrs...)
	// Levels are rendered even when a cluster value is wrong, so that one
	// run reports every mistake; nothing is returned unless all is well.

	r := renderer{cluster: cl, catalog: in.Catalog, served: in.Served, apiVersion: apiVersion}
	out := make([]Template, 0, len(levels))
	byName := map[string]string{}
	for _, lv := range levels {
		spec, key, err := r.spec(lv)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hash, err := specHash(spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", lv.path, err))
			continue
		}
		if cl.name == "" {
			continue // already reported
		}
		role := "cp"
		if lv.md != "" {
			role = lv.md
		}
		name := cl.name + "-" + role + "-" + hash
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: template name %q is not a valid object name: %v", lv.path, name, msgs))
			continue
		}
		// Only a machine deployment named "cp" can collide, with the
		// control plane; two owners of one template would make deleting
		// either of them unsafe.
		if other, ok := byName[name]; ok {
			errs = append(errs, fmt.Errorf("%s: template name %s is also the name of the template of %s; rename the machine deployment", lv.path, name, other))
			continue
		}
		byName[name] = lv.path
		meta := map[string]any{"name": name}
		if in.Namespace != "" {
			meta["namespace"] = in.Namespace
		}
		out = append(out, Template{
			Level:             lv.path,
			MachineDeployment: lv.md,
			ImageKey:          key,
			Object: map[string]any{
				"apiVersion": apiVersion,
				"kind":       Kind,
				"metadata":   meta,
				"spec":       spec,
			},
		})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

func normalizeAPIVersion(v string) (string, error) {
	switch v {
	case "", V1Beta1, "v1beta1":
		return V1Beta1, nil
	case V1Beta2, "v1beta2":
		return V1Beta2, nil
	}
	return "", fmt.Errorf("API version %q: Metal3MachineTemplate can be rendered as %s or %s", v, V1Beta1, V1Beta2)
}

// cluster holds the cluster-wide values that levels need.
type cluster struct {
	name     string
	finalize selector.Cluster
	// finalizeErr is why finalize cannot be read; it is reported by the
	// levels whose selector needs finalizing.
	finalizeErr error
}

func readCluster(v values.Values) (cluster, []error) {
	var cl cluster
	var errs []error
	var err error
	if cl.name, err = values.String(v, "name", ".name"); err != nil {
		errs = append(errs, err)
	}
	cl.finalize, cl.finalizeErr = readFinalize(v)
	providers, err := values.Map(v, "capi_providers", ".capi_providers")
	if err != nil {
		return cl, append(errs, err)
	}
	// Rendering Metal3 templates for a cluster of another infrastructure
	// provider is always a mistake of the caller; an absent value is taken
	// as capm3, since that is why the caller came here.
	infra, err := values.String(providers, "infra_provider", ".capi_providers.infra_provider")
	if err != nil {
		errs = append(errs, err)
	} else if infra != "" && infra != "capm3" {
		errs = append(errs, fmt.Errorf(".capi_providers.infra_provider: is %q, and only capm3 clusters have Metal3MachineTemplates", infra))
	}
	return cl, errs
}

// readFinalize reads what finalizing a selector takes from the cluster's
// values. They are used as written, never re-formatted: a k8s_version
// written as the number 1.30 is refused, not read as "1.3".
func readFinalize(v values.Values) (selector.Cluster, error) {
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
		if isSet(t) {
			c.AutoselectRegistries = str(v, "os_image_selector_autoselect_registries", ".os_image_selector_autoselect_registries")
		}
	}
	return c, errors.Join(errs...)
}

// level is the merged capm3 values of one template.
type level struct {
	path   string // values path, for error messages
	md     string // machine deployment name, empty for the control plane
	values values.Values
}

// splitLevels deep-merges, for each template, the capm3 maps that apply to
// it, most general first.
func splitLevels(v values.Values) ([]level, []error) {
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
	levels := []level{{path: ".control_plane.capm3", values: values.Overlay(root, cp)}}
	names := make([]string, 0, len(mds))
	for name, md := range mds {
		// A null machine deployment is one removed by a later values
		// file, as Helm does.
		if md != nil {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	mdBase := values.Overlay(root, mdDefault)
	for _, name := range names {
		path := ".machine_deployments." + name
		own := sub(sub(mds, name, path), "capm3", path+".capm3")
		levels = append(levels, level{path: path + ".capm3", md: name, values: values.Overlay(mdBase, own)})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return levels, nil
}
