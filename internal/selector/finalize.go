package selector

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Cluster is what finalizing a selector needs to know of the cluster.
type Cluster struct {
	// K8sVersion is the cluster's k8s_version, such as v1.32.5+rke2r1.
	K8sVersion string
	// K8sVersionSet says that k8s_version is given even though it is
	// empty: as in Sylva, "" is then the k8s-version pattern (which only
	// an empty field matches). An empty K8sVersion without it is missing.
	K8sVersionSet bool
	// BootstrapProvider is capi_providers.bootstrap_provider, such as cabpr.
	BootstrapProvider string
	// AutoselectRegistries is os_image_selector_autoselect_registries, a
	// pattern of registry keys; empty means any registry.
	AutoselectRegistries string
}

// DefaultAutoselectRegistries lets images of any registry, and images
// declared by hand (which have no registry key), be picked.
const DefaultAutoselectRegistries = ".*"

// k8sFlavors maps a CAPI bootstrap provider to the k8s-flavor of the images
// it can boot.
var k8sFlavors = map[string]string{
	"cabpk":  "kubeadm",
	"cabpr":  "rke2",
	"cabpck": "ck8s",
	"cabpoa": "openshift",
}

// K8sFlavor returns the k8s-flavor of the images that bootstrapProvider
// can boot.
func K8sFlavor(bootstrapProvider string) (string, error) {
	if f, ok := k8sFlavors[bootstrapProvider]; ok {
		return f, nil
	}
	known := slices.Sorted(maps.Keys(k8sFlavors))
	return "", fmt.Errorf("bootstrap provider %q has no known k8s-flavor (known: %s); set k8s-flavor in the OS image selector", bootstrapProvider, strings.Join(known, ", "))
}

// K8sVersionPattern turns a k8s_version into the k8s-version pattern that
// selects images built for it: v1.32.5+rke2r1 -> 1.32.5\+rke2r1.
//
// Only "+" is escaped, as Sylva does, so that osimages picks exactly the
// images Sylva would. The dots stay "any character"; that can only let a
// version such as 1x32x5 match too, which no image carries, and escaping
// them would make a pattern that differs from Sylva's for no practical gain.
// "+" must be escaped because it would otherwise repeat the preceding
// character and never match the "+" of the version.
func K8sVersionPattern(k8sVersion string) string {
	return strings.ReplaceAll(strings.TrimPrefix(k8sVersion, "v"), "+", `\+`)
}

// Finalize returns sel completed for cluster c with the keys the user left
// out: k8s-version, k8s-flavor and oci-image-registry-key. A key the user
// set is kept as is, so a user can always widen or narrow the defaults. sel
// itself is not changed.
//
// A cluster value is only required when its key has to be added: a user who
// sets k8s-flavor can use a bootstrap provider osimages does not know.
func Finalize(sel Selector, c Cluster) (Selector, error) {
	out := sel
	var err error
	if !out.Has(osimage.FieldK8sVersion) {
		if c.K8sVersion == "" && !c.K8sVersionSet {
			return Selector{}, fmt.Errorf("k8s_version is not set, so the OS image selector cannot be completed with k8s-version")
		}
		if out, err = out.with(osimage.FieldK8sVersion, K8sVersionPattern(c.K8sVersion)); err != nil {
			return Selector{}, fmt.Errorf("k8s_version %q: %w", c.K8sVersion, err)
		}
	}
	if !out.Has(osimage.FieldK8sFlavor) {
		flavor, err := K8sFlavor(c.BootstrapProvider)
		if err != nil {
			return Selector{}, err
		}
		if out, err = out.with(osimage.FieldK8sFlavor, flavor); err != nil {
			return Selector{}, err
		}
	}
	if !out.Has(osimage.FieldRegistryKey) {
		regs := c.AutoselectRegistries
		if regs == "" {
			regs = DefaultAutoselectRegistries
		}
		if out, err = out.with(osimage.FieldRegistryKey, regs); err != nil {
			return Selector{}, fmt.Errorf("os_image_selector_autoselect_registries: %w", err)
		}
	}
	return out, nil
}
