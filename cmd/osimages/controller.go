package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/controller"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
)

func newControllerCommand() *cobra.Command {
	o := controller.CommandOptions{}
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
			return controller.RunCommand(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.Catalog, "catalog", true, "publish os-images-info in the namespaces holding catalog inputs")
	f.BoolVar(&o.Propagate, "propagate", true, "copy the served set into the workload-cluster namespaces")
	f.BoolVar(&o.Check, "check", true, "check that the images each workload cluster needs are served")
	f.StringVar(&o.PropagateConfig, "config", "", "propagation rules file (default: Sylva's one rule)")
	f.BoolVar(&o.Adopt, "adopt", false, "propagation: take over copies that osimages did not create (such as Kyverno's)")
	f.StringVar(&o.ServedCopy, "served-copy", controller.DefaultServedCopy, "check: name of the copy of the served set in each workload-cluster namespace")
	f.StringVar(&o.FleetNeeds, "fleet-needs", "sylva-system/"+fleet.FleetNeedsConfigMapName, "check: NAMESPACE/NAME of the ConfigMap where the images the workload clusters need are published, for serve --serve-fleet-needs (\"\": not published)")
	f.StringVar(&o.NamespaceSelector, "check-namespace-selector", controller.WorkloadClusterLabel, "check: label selector of the workload-cluster namespaces")
	f.StringVar(&o.LeaderElectionID, "leader-election-id", controller.DefaultLeaderElectionID, "name of the leader-election Lease")
	f.DurationVar(&o.Resync, "resync", 10*time.Minute, "look at every object at least this often, events or not")
	f.IntVar(&o.Workers, "workers", 4, "namespaces reconciled at once, per part")
	o.Manager.AddFlags(f, osimage.ServedConfigMapNamespace)
	addRegistryFlags(f, &o.Registry)
	f.IntVar(&o.CatalogConcurrency, "catalog-concurrency", 8, "catalog: manifests fetched at once")
	f.DurationVar(&o.CatalogTimeout, "catalog-timeout", 60*time.Second, "catalog: time allowed to resolve one image, retries included")
	f.DurationVar(&o.CatalogRunTimeout, "catalog-run-timeout", 5*time.Minute, "catalog: time allowed to one namespace's run; a run past it is stopped, reported and retried with backoff")
	f.StringArrayVar(&o.CatalogRegistriesFrom, "catalog-registries-from", nil, "catalog: values file (repeatable) whose os_images_oci_registries name registries the namespaces' catalogs may reach, such as the management cluster's sylva-units values")
	f.StringArrayVar(&o.CatalogAllowRegistries, "catalog-allow-registry", nil, "catalog: a registry host[:port] (repeatable) the namespaces' catalogs may reach, besides those of --catalog-registries-from")
	f.BoolVar(&o.CatalogAllowAnyRegistry, "catalog-allow-any-registry", false, "catalog: let the namespaces' catalogs reach any registry their values name (only where every writer of catalog values is trusted)")
	f.StringVar(&o.MaxInputSize, "max-input-size", "512Ki", "data a namespace's catalog-values ConfigMaps, and its cluster-values ConfigMaps, may hold; a ConfigMap over it is refused with an event, not held in memory")
	return cmd
}
