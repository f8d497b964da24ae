package catalog

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/values"
)

// RegistryHosts returns the canonical hosts (oci.CanonicalHost) of the
// enabled registries of os_images_oci_registries, sorted: the registries
// the management values declare, from which the image server may serve
// what the fleet needs. A registry whose url cannot be read is left out,
// with the error.
func RegistryHosts(v values.Values) ([]string, error) {
	regs, err := registriesFromValues(values.NewRenderer(context.Background(), v), v, false)
	hosts := map[string]bool{}
	for _, reg := range regs {
		if !reg.enabled {
			continue
		}
		if repo, ok := oci.CanonicalRepository(reg.url); ok {
			host, _, _ := strings.Cut(repo, "/")
			hosts[host] = true
		}
	}
	return slices.Sorted(maps.Keys(hosts)), err
}
