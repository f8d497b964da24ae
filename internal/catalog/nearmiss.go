package catalog

import (
	"maps"
	"slices"

	"github.com/sylva-projects/osimages/internal/values"
)

// The keys of contract §2 that the catalog reads, for the near-miss check
// (values.NearMisses): a values file that lacks one of them but holds a
// look-alike (os_image, cosign_public_key) is refused with a hint, instead
// of publishing a catalog without the images, or the signature check, the
// operator meant.
var (
	catalogKeys  = []string{"os_images", "sylva_diskimagebuilder_images"}
	trustKeys    = []string{"os_images_oci_registries", "oci_registry_insecure", "security"}
	registryKeys = []string{"url", "tag", "cosign_publickey", "enabled"}
	dibKeys      = []string{"os_images_oci_registry", "enabled"}
)

// ValuesNearMisses reports the near-misses of the keys the catalog reads.
func ValuesNearMisses(v values.Values) []error {
	errs := values.NearMisses(v, "", append(slices.Clone(catalogKeys), trustKeys...)...)
	dib, _ := values.Map(v, "sylva_diskimagebuilder_images", "")
	for _, key := range slices.Sorted(maps.Keys(dib)) {
		if entry, ok := dib[key].(map[string]any); ok {
			errs = append(errs, values.NearMisses(entry, "sylva_diskimagebuilder_images."+key, dibKeys...)...)
		}
	}
	return append(errs, trustNearMisses(v, false)...)
}

// TrustNearMisses reports the near-misses of the keys the image server reads
// from its values for signatures and registries: os_images_oci_registries
// and its entries, oci_registry_insecure, security.os_images.skip_signing_check.
func TrustNearMisses(v values.Values) []error { return trustNearMisses(v, true) }

func trustNearMisses(v values.Values, top bool) []error {
	var errs []error
	if top {
		errs = values.NearMisses(v, "", trustKeys...)
	}
	regs, _ := values.Map(v, "os_images_oci_registries", "")
	for _, key := range slices.Sorted(maps.Keys(regs)) {
		if entry, ok := regs[key].(map[string]any); ok {
			errs = append(errs, values.NearMisses(entry, "os_images_oci_registries."+key, registryKeys...)...)
		}
	}
	security, _ := values.Map(v, "security", "")
	errs = append(errs, values.NearMisses(security, "security", "os_images")...)
	if osImages, _ := values.Map(security, "os_images", ""); osImages != nil {
		errs = append(errs, values.NearMisses(osImages, "security.os_images", "skip_signing_check")...)
	}
	return errs
}
