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

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sylva-projects/osimages/internal/levels"
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
)

// Input is everything a rendering depends on.
type Input struct {
	// Values are the cluster's merged values (sylva-capi-cluster's).
	Values values.Values
	// Catalog is (A), the cluster's own os_images: the only source of the
	// image picked.
	Catalog osimage.Catalog
	// CatalogFrom names where Catalog comes from beside the values' own
	// os_images, such as "ConfigMap sylva-system/os-images-info", so that
	// an error in an image record names the input to correct; empty when
	// Catalog is the values' os_images alone.
	CatalogFrom string
	// Served is (B), what the management cluster's image server serves:
	// only checked against, never picked from.
	Served osimage.ServedSet
	// ServedOCI is where that server answers each available image through
	// oci:// (its served-oci.yaml), nil when unknown (Sylva's chart, which
	// reads values.yaml only, or a server that does not publish it). Like
	// Served, it is only checked against: an oci:// URL render writes must
	// name the manifest the server answers.
	ServedOCI osimage.ServedOCI
	// APIVersion is V1Beta1 (when empty) or V1Beta2; "v1beta1" and
	// "v1beta2" are accepted too.
	APIVersion string
	// Namespace, when set, goes into each object's metadata.
	Namespace string
	// OCIRefused, when set, is why the target cluster's CAPM3 refuses a
	// template whose image is given by oci:// (metal3.OCIRefusal of its
	// CRD): a level with image_delivery: oci then fails with it. Nil when
	// CAPM3 accepts them, or when render does not know the cluster.
	OCIRefused error
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
// template is returned, so nothing half-rendered can be applied. A level
// whose image could not be picked or is not served is a *PickError in it;
// anything else is a fault of the input (InputFault).
func Render(in Input) ([]Template, error) {
	apiVersion, err := NormalizeAPIVersion(in.APIVersion)
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
	lvs, lerrs := levels.Split(in.Values)
	errs = append(errs, lerrs...)
	// Levels are rendered even when a cluster value is wrong, so that one
	// run reports every mistake; nothing is returned unless all is well.

	r := renderer{values: in.Values, catalogFrom: in.CatalogFrom, cluster: cl, catalog: in.Catalog, served: in.Served, servedOCI: in.ServedOCI, apiVersion: apiVersion, ociRefused: in.OCIRefused}
	out := make([]Template, 0, len(lvs))
	byName := map[string]string{}
	for _, lv := range lvs {
		spec, key, err := r.spec(lv)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hash, err := specHash(spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", lv.Path, err))
			continue
		}
		if cl.name == "" {
			continue // already reported
		}
		role := "cp"
		if lv.MachineDeployment != "" {
			role = lv.MachineDeployment
		}
		name := cl.name + "-" + role + "-" + hash
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: template name %q is not a valid object name: %v", lv.Path, name, msgs))
			continue
		}
		// Only a machine deployment named "cp" can collide, with the
		// control plane; two owners of one template would make deleting
		// either of them unsafe.
		if other, ok := byName[name]; ok {
			errs = append(errs, fmt.Errorf("%s: template name %s is also the name of the template of %s; rename the machine deployment", lv.Path, name, other))
			continue
		}
		byName[name] = lv.Path
		meta := map[string]any{"name": name}
		if in.Namespace != "" {
			meta["namespace"] = in.Namespace
		}
		out = append(out, Template{
			Level:             lv.Path,
			MachineDeployment: lv.MachineDeployment,
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

// NormalizeAPIVersion returns the full API version that v names (see
// Input.APIVersion), or an error quoting v.
func NormalizeAPIVersion(v string) (string, error) {
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
	cl.finalize, cl.finalizeErr = levels.Finalization(v)
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
