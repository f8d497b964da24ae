package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/propagate"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// CommandOptions are those of `osimages controller`, as its flags give
// them. Errors name the flags.
type CommandOptions struct {
	Manager                   kube.ManagerFlags
	Catalog, Propagate, Check bool
	LeaderElectionID          string
	Resync                    time.Duration
	Workers                   int
	// PropagateConfig is the propagation rules file ("": Sylva's rule);
	// Adopt takes over copies osimages did not create.
	PropagateConfig string
	Adopt           bool
	// ServedCopy and NamespaceSelector are those of the check.
	ServedCopy, NamespaceSelector string
	// FleetNeeds is the check's NS/NAME of the fleet's needs ("": not
	// published).
	FleetNeeds         string
	Registry           oci.Options
	CatalogConcurrency int
	CatalogTimeout     time.Duration
	CatalogRunTimeout  time.Duration
	// MaxInputSize is a quantity, such as 512Ki.
	MaxInputSize string
	// The registries catalogs may reach: those of the
	// os_images_oci_registries of the values files CatalogRegistriesFrom,
	// and CatalogAllowRegistries; or any, with CatalogAllowAnyRegistry.
	CatalogRegistriesFrom   []string
	CatalogAllowRegistries  []string
	CatalogAllowAnyRegistry bool
}

// RunCommand checks o, then runs the parts it switches on until ctx ends,
// logging to stderr. Wrong flags are an exitcode.InputError, a controller
// that fails an exitcode.FailureError.
func RunCommand(ctx context.Context, o CommandOptions, stderr io.Writer) error {
	opts, err := o.options()
	if err != nil {
		return exitcode.InputError(err)
	}
	cfg, mgr, err := o.Manager.Setup(stderr, o.LeaderElectionID)
	if err != nil {
		return exitcode.InputError(err)
	}
	opts.ManagerOptions = mgr
	mgr.Logger.Info("starting", "catalog", o.Catalog, "propagate", o.Propagate, "check", o.Check)
	return exitcode.FailureError(Run(ctx, cfg, opts))
}

// catalogRegistries returns the registries the namespaces' catalogs may
// reach; nil (any) only when the operator says so.
func (o CommandOptions) catalogRegistries() (*catalog.RegistryAllowlist, error) {
	if o.CatalogAllowAnyRegistry {
		if len(o.CatalogRegistriesFrom)+len(o.CatalogAllowRegistries) > 0 {
			return nil, errors.New("--catalog-allow-any-registry goes without --catalog-registries-from and --catalog-allow-registry")
		}
		return nil, nil
	}
	if len(o.CatalogRegistriesFrom)+len(o.CatalogAllowRegistries) == 0 {
		return nil, errors.New("--catalog: say which registries the namespaces' catalogs may reach, or the controller would connect wherever a tenant's values point: --catalog-registries-from MANAGEMENT-VALUES.yaml (their os_images_oci_registries), --catalog-allow-registry HOST[:PORT], or --catalog-allow-any-registry")
	}
	hosts := slices.Clone(o.CatalogAllowRegistries)
	for _, f := range o.CatalogRegistriesFrom {
		v, err := values.LoadFiles(f)
		if err != nil {
			return nil, fmt.Errorf("--catalog-registries-from %w", err)
		}
		found, err := catalog.RegistryHosts(v)
		if err != nil {
			return nil, fmt.Errorf("--catalog-registries-from %s: %w", f, err)
		}
		hosts = append(hosts, found...)
	}
	for _, h := range o.CatalogAllowRegistries {
		if h == "" || strings.ContainsAny(h, " \t\n") {
			return nil, fmt.Errorf("--catalog-allow-registry %q: give a registry host, such as registry.example.org or 10.0.0.1:5000", h)
		}
	}
	return catalog.NewRegistryAllowlist(hosts...), nil
}

// options checks o and returns the Options it gives, but the manager's.
func (o CommandOptions) options() (Options, error) {
	if o.Workers < 1 || o.CatalogConcurrency < 1 {
		return Options{}, fmt.Errorf("--workers %d and --catalog-concurrency %d: must be at least 1", o.Workers, o.CatalogConcurrency)
	}
	if o.Resync <= 0 {
		return Options{}, fmt.Errorf("--resync %s: must be positive", o.Resync)
	}
	if o.CatalogTimeout <= 0 || o.CatalogRunTimeout <= 0 {
		return Options{}, fmt.Errorf("--catalog-timeout %s and --catalog-run-timeout %s: must be positive", o.CatalogTimeout, o.CatalogRunTimeout)
	}
	maxInput, err := kube.Quantity("--max-input-size", o.MaxInputSize)
	if err != nil {
		return Options{}, err
	}
	if maxInput <= 0 || maxInput > 1<<30 {
		return Options{}, fmt.Errorf("--max-input-size %s: must be between 1 and 1Gi", o.MaxInputSize)
	}
	if !o.Catalog && !o.Propagate && !o.Check {
		return Options{}, fmt.Errorf("--catalog, --propagate and --check are all false: nothing to run")
	}
	if err := o.Manager.Validate(); err != nil {
		return Options{}, err
	}
	if err := kube.ValidateName(o.LeaderElectionID); err != nil {
		return Options{}, fmt.Errorf("--leader-election-id: %w", err)
	}
	opts := Options{Workers: o.Workers, Resync: o.Resync, MaxInputSize: int(maxInput)}
	if o.Propagate {
		rules, err := propagate.LoadRulesOrDefault(o.PropagateConfig)
		if err != nil {
			return Options{}, err
		}
		opts.Propagate = &propagate.Options{Rules: rules, Adopt: o.Adopt, Resync: o.Resync, Workers: o.Workers}
	}
	if o.Check {
		sel, err := labels.Parse(o.NamespaceSelector)
		if err != nil {
			return Options{}, fmt.Errorf("--check-namespace-selector %q: %w", o.NamespaceSelector, err)
		}
		if err := kube.ValidateName(o.ServedCopy); err != nil {
			return Options{}, fmt.Errorf("--served-copy: %w", err)
		}
		opts.Check = &CheckOptions{Namespaces: sel, ServedCopy: o.ServedCopy, Resync: o.Resync}
		if o.FleetNeeds != "" {
			key, err := kube.ParseObjectKey(o.FleetNeeds)
			if err != nil {
				return Options{}, fmt.Errorf("--fleet-needs %w, such as sylva-system/%s, or \"\" not to publish the fleet's needs", err, fleet.FleetNeedsConfigMapName)
			}
			opts.Check.FleetNeeds = types.NamespacedName{Namespace: key.Namespace, Name: key.Name}
		}
	}
	if o.Catalog {
		reg := o.Registry
		reg.MaxConnsPerHost = o.CatalogConcurrency
		clients, err := oci.NewClients(reg)
		if err != nil {
			return Options{}, err
		}
		allowed, err := o.catalogRegistries()
		if err != nil {
			return Options{}, err
		}
		opts.Catalog = &CatalogOptions{
			Concurrency: o.CatalogConcurrency, Timeout: o.CatalogTimeout, RunTimeout: o.CatalogRunTimeout,
			Secure:     Registry{Manifests: clients.Secure, Signatures: signature.Verifier{Client: clients.Secure}},
			Insecure:   Registry{Manifests: clients.Insecure, Signatures: signature.Verifier{Client: clients.Insecure}},
			Registries: allowed,
		}
	}
	return opts, nil
}
