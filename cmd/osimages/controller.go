package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/controller"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// controllerOptions are the flags of `osimages controller`.
type controllerOptions struct {
	manager                   managerFlags
	catalog, propagate, check bool
	leaderElectionID          string
	resync                    time.Duration
	workers                   int
	// propagateConfig is the propagation rules file ("": Sylva's rule);
	// adopt takes over copies osimages did not create.
	propagateConfig string
	adopt           bool
	// servedCopy and namespaceSelector are those of the check.
	servedCopy, namespaceSelector string
	// fleetNeeds is the check's NS/NAME of the fleet's needs ("": not
	// published).
	fleetNeeds         string
	registry           oci.Options
	catalogConcurrency int
	catalogTimeout     time.Duration
	catalogRunTimeout  time.Duration
	// maxInputSize is a quantity, such as 512Ki.
	maxInputSize string
	// The registries catalogs may reach: those of the
	// os_images_oci_registries of the values files catalogRegistriesFrom,
	// and catalogAllowRegistries; or any, with catalogAllowAnyRegistry.
	catalogRegistriesFrom   []string
	catalogAllowRegistries  []string
	catalogAllowAnyRegistry bool
}

func newControllerCommand() *cobra.Command {
	o := controllerOptions{}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the management cluster's catalog, propagation and served-set check in one manager",
		Long: `controller runs, in one controller-runtime manager with leader election, each
part switched on or off by a flag:

  --catalog    in every namespace holding a ConfigMap labelled
               osimages.sylva-project.org/catalog-values (sylva-units values
               under values.yaml; several merge in name order), resolve the
               catalog and publish os-images-info beside it, as
               'osimages catalog --apply' does; each namespace's run has a
               budget (--catalog-run-timeout) and a fair share of the
               registry requests, and its state is in osimages-status;
  --propagate  copy the served set into every workload-cluster namespace,
               as 'osimages propagate' does (--config, --adopt);
  --check      in every workload-cluster namespace, find the images the
               cluster uses or will use (its Metal3MachineTemplates and
               Metal3Machines, and the picks of its values: ConfigMaps
               labelled osimages.sylva-project.org/cluster-values, picked
               from its own os-images-info), compare them with its copy of
               the served set, and report each one missing or not yet
               available: an event on the namespace, the metric
               osimages_cluster_images_unserved, and ConfigMap
               osimages-status in the namespace.

The image server stays a process of its own ('osimages serve').

Exit codes: 0 stopped by a signal, 1 the controller failed, 2 wrong flags.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runController(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.catalog, "catalog", true, "publish os-images-info in the namespaces holding catalog inputs")
	f.BoolVar(&o.propagate, "propagate", true, "copy the served set into the workload-cluster namespaces")
	f.BoolVar(&o.check, "check", true, "check that the images each workload cluster needs are served")
	f.StringVar(&o.propagateConfig, "config", "", "propagation rules file (default: Sylva's one rule)")
	f.BoolVar(&o.adopt, "adopt", false, "propagation: take over copies that osimages did not create (such as Kyverno's)")
	f.StringVar(&o.servedCopy, "served-copy", controller.DefaultServedCopy, "check: name of the copy of the served set in each workload-cluster namespace")
	f.StringVar(&o.fleetNeeds, "fleet-needs", "sylva-system/"+osimage.FleetNeedsConfigMapName, "check: NAMESPACE/NAME of the ConfigMap where the images the workload clusters need are published, for serve --serve-fleet-needs (\"\": not published)")
	f.StringVar(&o.namespaceSelector, "check-namespace-selector", controller.WorkloadClusterLabel, "check: label selector of the workload-cluster namespaces")
	f.StringVar(&o.leaderElectionID, "leader-election-id", controller.DefaultLeaderElectionID, "name of the leader-election Lease")
	f.DurationVar(&o.resync, "resync", 10*time.Minute, "look at every object at least this often, events or not")
	f.IntVar(&o.workers, "workers", 4, "namespaces reconciled at once, per part")
	o.manager.addFlags(f, osimage.ServedConfigMapNamespace)
	addRegistryFlags(f, &o.registry)
	f.IntVar(&o.catalogConcurrency, "catalog-concurrency", 8, "catalog: manifests fetched at once")
	f.DurationVar(&o.catalogTimeout, "catalog-timeout", 60*time.Second, "catalog: time allowed to resolve one image, retries included")
	f.DurationVar(&o.catalogRunTimeout, "catalog-run-timeout", 5*time.Minute, "catalog: time allowed to one namespace's run; a run past it is stopped, reported and retried with backoff")
	f.StringArrayVar(&o.catalogRegistriesFrom, "catalog-registries-from", nil, "catalog: values file (repeatable) whose os_images_oci_registries name registries the namespaces' catalogs may reach, such as the management cluster's sylva-units values")
	f.StringArrayVar(&o.catalogAllowRegistries, "catalog-allow-registry", nil, "catalog: a registry host[:port] (repeatable) the namespaces' catalogs may reach, besides those of --catalog-registries-from")
	f.BoolVar(&o.catalogAllowAnyRegistry, "catalog-allow-any-registry", false, "catalog: let the namespaces' catalogs reach any registry their values name (only where every writer of catalog values is trusted)")
	f.StringVar(&o.maxInputSize, "max-input-size", "512Ki", "data a namespace's catalog-values ConfigMaps, and its cluster-values ConfigMaps, may hold; a ConfigMap over it is refused with an event, not held in memory")
	return cmd
}

// runController checks o, then runs the parts it switches on until ctx
// ends, logging to stderr. Wrong flags exit 2, a controller that fails 1.
func runController(ctx context.Context, o controllerOptions, stderr io.Writer) error {
	opts, err := o.options()
	if err != nil {
		return exitcode.InputError(err)
	}
	cfg, mgr, err := o.manager.setup(stderr, o.leaderElectionID)
	if err != nil {
		return exitcode.InputError(err)
	}
	opts.ManagerOptions = mgr
	mgr.Logger.Info("starting", "catalog", o.catalog, "propagate", o.propagate, "check", o.check)
	return exitcode.FailureError(controller.Run(ctx, cfg, opts))
}

// catalogRegistries returns the registries the namespaces' catalogs may
// reach; nil (any) only when the operator says so.
func (o controllerOptions) catalogRegistries() (*catalog.RegistryAllowlist, error) {
	if o.catalogAllowAnyRegistry {
		if len(o.catalogRegistriesFrom)+len(o.catalogAllowRegistries) > 0 {
			return nil, errors.New("--catalog-allow-any-registry goes without --catalog-registries-from and --catalog-allow-registry")
		}
		return nil, nil
	}
	if len(o.catalogRegistriesFrom)+len(o.catalogAllowRegistries) == 0 {
		return nil, errors.New("--catalog: say which registries the namespaces' catalogs may reach, or the controller would connect wherever a tenant's values point: --catalog-registries-from MANAGEMENT-VALUES.yaml (their os_images_oci_registries), --catalog-allow-registry HOST[:PORT], or --catalog-allow-any-registry")
	}
	hosts := slices.Clone(o.catalogAllowRegistries)
	for _, f := range o.catalogRegistriesFrom {
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
	for _, h := range o.catalogAllowRegistries {
		if h == "" || strings.ContainsAny(h, " \t\n") {
			return nil, fmt.Errorf("--catalog-allow-registry %q: give a registry host, such as registry.example.org or 10.0.0.1:5000", h)
		}
	}
	return catalog.NewRegistryAllowlist(hosts...), nil
}

// options checks o and returns the controller.Options it gives, but the
// manager's.
func (o controllerOptions) options() (controller.Options, error) {
	if o.workers < 1 || o.catalogConcurrency < 1 {
		return controller.Options{}, fmt.Errorf("--workers %d and --catalog-concurrency %d: must be at least 1", o.workers, o.catalogConcurrency)
	}
	if o.resync <= 0 {
		return controller.Options{}, fmt.Errorf("--resync %s: must be positive", o.resync)
	}
	if o.catalogTimeout <= 0 || o.catalogRunTimeout <= 0 {
		return controller.Options{}, fmt.Errorf("--catalog-timeout %s and --catalog-run-timeout %s: must be positive", o.catalogTimeout, o.catalogRunTimeout)
	}
	maxInput, err := kube.Quantity("--max-input-size", o.maxInputSize)
	if err != nil {
		return controller.Options{}, err
	}
	if maxInput <= 0 || maxInput > 1<<30 {
		return controller.Options{}, fmt.Errorf("--max-input-size %s: must be between 1 and 1Gi", o.maxInputSize)
	}
	if !o.catalog && !o.propagate && !o.check {
		return controller.Options{}, fmt.Errorf("--catalog, --propagate and --check are all false: nothing to run")
	}
	if err := o.manager.validate(); err != nil {
		return controller.Options{}, err
	}
	if err := kube.ValidateName(o.leaderElectionID); err != nil {
		return controller.Options{}, fmt.Errorf("--leader-election-id: %w", err)
	}
	opts := controller.Options{Workers: o.workers, Resync: o.resync, MaxInputSize: int(maxInput)}
	if o.propagate {
		rules, err := propagate.LoadRulesOrDefault(o.propagateConfig)
		if err != nil {
			return controller.Options{}, err
		}
		opts.Propagate = &propagate.Options{Rules: rules, Adopt: o.adopt, Resync: o.resync, Workers: o.workers}
	}
	if o.check {
		sel, err := labels.Parse(o.namespaceSelector)
		if err != nil {
			return controller.Options{}, fmt.Errorf("--check-namespace-selector %q: %w", o.namespaceSelector, err)
		}
		if err := kube.ValidateName(o.servedCopy); err != nil {
			return controller.Options{}, fmt.Errorf("--served-copy: %w", err)
		}
		opts.Check = &controller.CheckOptions{Namespaces: sel, ServedCopy: o.servedCopy, Resync: o.resync}
		if o.fleetNeeds != "" {
			key, err := kube.ParseObjectKey(o.fleetNeeds)
			if err != nil {
				return controller.Options{}, fmt.Errorf("--fleet-needs %w, such as sylva-system/%s, or \"\" not to publish the fleet's needs", err, osimage.FleetNeedsConfigMapName)
			}
			opts.Check.FleetNeeds = types.NamespacedName{Namespace: key.Namespace, Name: key.Name}
		}
	}
	if o.catalog {
		reg := o.registry
		reg.MaxConnsPerHost = o.catalogConcurrency
		clients, err := oci.NewClients(reg)
		if err != nil {
			return controller.Options{}, err
		}
		allowed, err := o.catalogRegistries()
		if err != nil {
			return controller.Options{}, err
		}
		opts.Catalog = &controller.CatalogOptions{
			Concurrency: o.catalogConcurrency, Timeout: o.catalogTimeout, RunTimeout: o.catalogRunTimeout,
			Secure:     controller.Registry{Manifests: clients.Secure, Signatures: signature.Verifier{Client: clients.Secure}},
			Insecure:   controller.Registry{Manifests: clients.Insecure, Signatures: signature.Verifier{Client: clients.Insecure}},
			Registries: allowed,
		}
	}
	return opts, nil
}
