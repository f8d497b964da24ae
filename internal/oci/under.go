package oci

import (
	"strings"

	"oras.land/oras-go/v2/registry"
)

// Under says whether the OCI image (or repository) uri lives under the
// registry url base, an os_images_oci_registries url: its repository is
// base's own, or below it at a path boundary (oci://h/sylva/dib holds
// oci://h/sylva/dib/x:1, not oci://h/sylva/dib-evil/x:1 nor
// oci://h/someone-else/x:1).
//
// It is the one rule of "this image belongs to that registry": the keys an
// image must be signed with (signature.Policy.KeysFor) and the registries a
// fleet need may be pulled from (servedset.FleetNeeds) both ask it, so that
// what is admitted because of a registry is exactly what that registry's
// cosign key checks.
//
// Both sides compare in canonical form (CanonicalRepository): host case,
// default ports and loopback spellings merged, trailing slashes and a tag
// or digest dropped. A path that is no valid OCI repository name (a ..
// segment, a %2e escape, an empty segment, a query) is under nothing: a
// registry does not resolve it below base, so no textual prefix may stand
// for it. Anything not oci:// (https:// included) is under no registry.
func Under(uri, base string) bool {
	repo, ok := validRepository(uri)
	if !ok {
		return false
	}
	prefix, ok := validRepository(base)
	return ok && (repo == prefix || strings.HasPrefix(repo, prefix+"/"))
}

// validRepository is CanonicalRepository of uri when its path is a valid
// OCI repository name (or empty: a whole registry).
func validRepository(uri string) (string, bool) {
	repo, ok := CanonicalRepository(uri)
	if !ok {
		return "", false
	}
	host, path, _ := strings.Cut(repo, "/")
	if host == "" {
		return "", false
	}
	if path != "" {
		if err := (registry.Reference{Registry: "localhost", Repository: path}).ValidateRepository(); err != nil {
			return "", false
		}
	}
	return repo, true
}
