package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sylva-projects/osimages/internal/controller"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
	"github.com/sylva-projects/osimages/internal/serve"
	"github.com/sylva-projects/osimages/internal/signature"
)

type controllerOptions struct {
	manager                   kube.ManagerFlags
	config                    string
	adopt                     bool
	resync                    time.Duration
	workers                   int
	catalog, propagate, check bool
	leaderID                  string
	servedCopy                string
	namespaceSelector         string
	registry                  oci.Options
	catalogConcurrency        int
	catalogTimeout            time.Duration
	catalogRunTimeout         time.Duration
	maxInputSize              string
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
			return runController(cmd, o)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.catalog, "catalog", true, "publish os-images-info in the namespaces holding catalog inputs")
	f.BoolVar(&o.propagate, "propagate", true, "copy the served set into the workload-cluster namespaces")
	f.BoolVar(&o.check, "check", true, "check that the images each workload cluster needs are served")
	f.StringVar(&o.config, "config", "", "propagation rules file (default: Sylva's one rule)")
	f.BoolVar(&o.adopt, "adopt", false, "propagation: take over copies that osimages did not create (such as Kyverno's)")
	f.StringVar(&o.servedCopy, "served-copy", controller.DefaultServedCopy, "check: name of the copy of the served set in each workload-cluster namespace")
	f.StringVar(&o.namespaceSelector, "check-namespace-selector", controller.WorkloadClusterLabel, "check: label selector of the workload-cluster namespaces")
	f.StringVar(&o.leaderID, "leader-election-id", controller.DefaultLeaderElectionID, "name of the leader-election Lease")
	f.DurationVar(&o.resync, "resync", 10*time.Minute, "look at every object at least this often, events or not")
	f.IntVar(&o.workers, "workers", 4, "namespaces reconciled at once, per part")
	o.manager.AddFlags(f, osimage.ServedConfigMapNamespace)
	addRegistryFlags(f, &o.registry)
	f.IntVar(&o.catalogConcurrency, "catalog-concurrency", 8, "catalog: manifests fetched at once")
	f.DurationVar(&o.catalogTimeout, "catalog-timeout", 60*time.Second, "catalog: time allowed to resolve one image, retries included")
	f.DurationVar(&o.catalogRunTimeout, "catalog-run-timeout", 5*time.Minute, "catalog: time allowed to one namespace's run; a run past it is stopped, reported and retried with backoff")
	f.StringVar(&o.maxInputSize, "max-input-size", "512Ki", "data a namespace's catalog-values ConfigMaps, and its cluster-values ConfigMaps, may hold; a ConfigMap over it is refused with an event, not held in memory")
	return cmd
}

func runController(cmd *cobra.Command, o controllerOptions) error {
	if o.workers < 1 || o.catalogConcurrency < 1 {
		return inputError(fmt.Errorf("--workers %d and --catalog-concurrency %d: must be at least 1", o.workers, o.catalogConcurrency))
	}
	if o.resync <= 0 {
		return inputError(fmt.Errorf("--resync %s: must be positive", o.resync))
	}
	if o.catalogTimeout <= 0 || o.catalogRunTimeout <= 0 {
		return inputError(fmt.Errorf("--catalog-timeout %s and --catalog-run-timeout %s: must be positive", o.catalogTimeout, o.catalogRunTimeout))
	}
	maxInput, err := serve.Quantity("--max-input-size", o.maxInputSize)
	if err != nil {
		return inputError(err)
	}
	if maxInput <= 0 || maxInput > 1<<30 {
		return inputError(fmt.Errorf("--max-input-size %s: must be between 1 and 1Gi", o.maxInputSize))
	}
	if !o.catalog && !o.propagate && !o.check {
		return inputError(fmt.Errorf("--catalog, --propagate and --check are all false: nothing to run"))
	}
	if err := o.manager.Validate(); err != nil {
		return inputError(err)
	}
	opts := controller.Options{Workers: o.workers, Resync: o.resync, MaxInputSize: int(maxInput)}
	if o.propagate {
		rules := propagate.DefaultRules()
		if o.config != "" {
			if rules, err = propagate.LoadRules(o.config); err != nil {
				return inputError(err)
			}
		}
		opts.Propagate = &propagate.Options{Rules: rules, Adopt: o.adopt, Resync: o.resync, Workers: o.workers}
	}
	if o.check {
		sel, err := labels.Parse(o.namespaceSelector)
		if err != nil {
			return inputError(fmt.Errorf("--check-namespace-selector %q: %w", o.namespaceSelector, err))
		}
		opts.Check = &controller.CheckOptions{Namespaces: sel, ServedCopy: o.servedCopy, Resync: o.resync}
	}
	if o.catalog {
		c := &controller.CatalogOptions{Concurrency: o.catalogConcurrency, Timeout: o.catalogTimeout, RunTimeout: o.catalogRunTimeout}
		clients, err := oci.NewClients(oci.Options{CAFile: o.registry.CAFile, RegistryConfig: o.registry.RegistryConfig, MaxConnsPerHost: o.catalogConcurrency})
		if err != nil {
			return inputError(err)
		}
		c.Secure = controller.Registry{Manifests: clients.Secure, Signatures: signature.Verifier{Client: clients.Secure}}
		c.Insecure = controller.Registry{Manifests: clients.Insecure, Signatures: signature.Verifier{Client: clients.Insecure}}
		opts.Catalog = c
	}
	cfg, mgr, err := o.manager.Setup(cmd.ErrOrStderr(), o.leaderID)
	if err != nil {
		return inputError(err)
	}
	opts.ManagerOptions = mgr
	mgr.Logger.Info("starting", "catalog", o.catalog, "propagate", o.propagate, "check", o.check)
	return failureError(controller.Run(cmd.Context(), cfg, opts))
}
