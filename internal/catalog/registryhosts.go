package catalog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/values"
)

// DeclaredRegistry is an enabled registry of os_images_oci_registries:
// its key and its url, rendered.
type DeclaredRegistry struct {
	Key, URL string
}

// String is how messages name it: "<key> (<url>)".
func (r DeclaredRegistry) String() string { return r.Key + " (" + r.URL + ")" }

// DeclaredRegistries returns the enabled registries of
// os_images_oci_registries, sorted by key: the registries under whose url
// (oci.Under) the image server may pull what the fleet needs. A registry
// whose url cannot be read is left out, with the error.
func DeclaredRegistries(v values.Values) ([]DeclaredRegistry, error) {
	regs, err := registriesFromValues(values.NewRenderer(context.Background(), v), v, false)
	var out []DeclaredRegistry
	for _, key := range slices.Sorted(maps.Keys(regs)) {
		if regs[key].enabled {
			out = append(out, DeclaredRegistry{Key: key, URL: regs[key].url})
		}
	}
	return out, err
}

// RegistryHosts returns the canonical hosts (oci.CanonicalHost) of the
// enabled registries of os_images_oci_registries, sorted: the hosts the
// fleet controller lets workload catalogs reach (RegistryAllowlist). A
// catalog reads manifests, never a layer; what the image server pulls for
// the fleet is bounded by the registries' urls, not their hosts
// (DeclaredRegistries). A registry whose url cannot be read is left out,
// with the error.
func RegistryHosts(v values.Values) ([]string, error) {
	regs, err := DeclaredRegistries(v)
	hosts := map[string]bool{}
	for _, reg := range regs {
		if repo, ok := oci.CanonicalRepository(reg.URL); ok {
			host, _, _ := strings.Cut(repo, "/")
			hosts[host] = true
		}
	}
	return slices.Sorted(maps.Keys(hosts)), err
}

// RegistryAllowlist is the registries a catalog may reach: in the fleet
// controller, a tenant's catalog values name the registries the controller
// connects to, and without a bound a tenant could make it connect to any
// host:port (the apiserver included) and read the class of the answer in
// its own status. Nil allows any registry (the `osimages catalog` command,
// run by an operator on its own values).
type RegistryAllowlist struct {
	hosts []string
}

// NewRegistryAllowlist allows the registries of hosts, each a host[:port]
// or an oci:// URL, compared as canonical hosts (oci.CanonicalHost).
func NewRegistryAllowlist(hosts ...string) *RegistryAllowlist {
	a := &RegistryAllowlist{}
	for _, h := range hosts {
		if repo, ok := oci.CanonicalRepository(h); ok {
			h, _, _ = strings.Cut(repo, "/")
		} else {
			h = oci.CanonicalHost(strings.TrimSuffix(h, "/"))
		}
		if h != "" && !slices.Contains(a.hosts, h) {
			a.hosts = append(a.hosts, h)
		}
	}
	slices.Sort(a.hosts)
	return a
}

// Check refuses a plan that would reach a registry the allowlist does not
// hold, naming every such image and its registry, before any connection.
func (a *RegistryAllowlist) Admit(p Plan) error {
	if a == nil {
		return nil
	}
	var errs []error
	for _, s := range p.Sources {
		repo, ok := oci.CanonicalRepository(s.URI)
		if !ok {
			continue // http(s): the catalog reads no byte of it
		}
		host, _, _ := strings.Cut(repo, "/")
		if !slices.Contains(a.hosts, host) {
			errs = append(errs, fmt.Errorf("os_images.%s (%s): registry %s is not one that workload catalogs may reach here", s.Key, s.URI, host))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	allowed := "none"
	if len(a.hosts) > 0 {
		allowed = strings.Join(a.hosts, ", ")
	}
	return fmt.Errorf("%w\nallowed registries: %s (the management values' os_images_oci_registries and the operator's --catalog-allow-registry; chart: controller.catalogAllowedRegistries): use one of them, or ask the operator to allow the registry; nothing was fetched", errors.Join(errs...), allowed)
}
