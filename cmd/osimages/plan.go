package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/controller"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/plan"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// planOptions are the flags of `osimages plan`.
type planOptions struct {
	// valueFiles are the proposed management values.
	valueFiles []string
	// osImages gives the proposed catalog instead of resolving it.
	osImages string
	// served and clusters (NS=FILE[,FILE]) give the current served set and
	// the workload clusters from files; without them they are read from
	// the cluster: servedConfigMap (NS/NAME) and the namespaces matching
	// namespaceSelector.
	served            string
	clusters          []string
	servedConfigMap   string
	kubeconfig        string
	namespaceSelector string
	registry          oci.Options
	timeout           time.Duration
	// fleetNeeds, when serve, adds to the proposed set what the fleet
	// needs within that policy, as serve --serve-fleet-needs would.
	fleetNeeds fleetNeedsFlags
}

func newPlanCommand() *cobra.Command {
	o := planOptions{}
	cmd := &cobra.Command{
		Use:   "plan -f proposed-mgmt-values.yaml [--kubeconfig K | --served FILE --cluster NS=FILE ...]",
		Short: "Tell, before a management upgrade, what the proposed management values would do to each workload cluster",
		Long: `plan computes the served set that the proposed management values would give
(the catalog of those values, resolved from the registries unless --os-images
gives it, then the image server's selection), and compares it with what each
workload cluster uses or will use: the images of its Metal3MachineTemplates and
Metal3Machines, and the picks of its own values from its own catalog. For each
cluster it prints one of:

  unchanged                          every image it needs stays served
  newly served: <sha256>/<key>       an image it needs becomes served
  would fail: <sha256>/<key> no longer served
  cannot tell: <why>                 its inputs cannot be read

With --kubeconfig, a cluster whose values ask for image_delivery: oci would
fail too when the CAPM3 installed refuses such templates (its
Metal3MachineTemplate CRD requires image.checksum: CAPM3 before v1.14.0).

From the cluster (--kubeconfig), the current served set is the image server's
output ConfigMap and the workload clusters are the namespaces matching
--namespace-selector, with their ConfigMaps labelled
osimages.sylva-project.org/cluster-values and their os-images-info. From
files, --served gives the current served set and each --cluster NS=FILE[,FILE]
the values of one cluster (with its os_images).

Exit codes: 0 no cluster would fail, 1 a cluster would fail or cannot be told,
2 wrong flags or values.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPlan(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.valueFiles, "values", "f", nil, "proposed management values; repeat to merge several, later wins")
	f.StringVar(&o.osImages, "os-images", "", "the proposed management catalog (os_images document or os-images-info manifest) instead of resolving it")
	f.StringVar(&o.served, "served", "", "the current served set (capm3_os_image_server_images document or ConfigMap manifest) instead of reading it from the cluster")
	f.StringVar(&o.servedConfigMap, "served-configmap", osimage.ServedConfigMapNamespace+"/"+osimage.ServedConfigMapName, "the image server's output ConfigMap, NS/NAME")
	f.StringArrayVar(&o.clusters, "cluster", nil, "a workload cluster from files, NS=values.yaml[,more.yaml]; repeat for each (then the cluster is not read)")
	addKubeconfigFlag(f, &o.kubeconfig)
	f.StringVar(&o.namespaceSelector, "namespace-selector", controller.WorkloadClusterLabel, "label selector of the workload-cluster namespaces")
	addFleetNeedsFlags(f, &o.fleetNeeds, "predict what serve --serve-fleet-needs does: also serve")
	addRegistryFlags(f, &o.registry)
	f.DurationVar(&o.timeout, "timeout", 60*time.Second, "time allowed to resolve one image of the proposed catalog")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}

// runPlan prints on stdout, for each workload cluster, what the proposed
// management values of o would do to it; warnings go to stderr. A cluster
// that would fail, or cannot be told, exits 1, wrong flags or values 2.
func runPlan(ctx context.Context, o planOptions, stdout, stderr io.Writer) error {
	if (o.served == "") != (len(o.clusters) == 0) {
		return exitcode.InputError(errors.New("give --served and --cluster together (all inputs from files), or neither (read them from the cluster)"))
	}
	policy, err := o.fleetNeeds.policy()
	if err != nil {
		return exitcode.InputError(err)
	}
	if o.timeout <= 0 {
		return exitcode.InputError(fmt.Errorf("--timeout %s: give a positive duration, such as 60s", o.timeout))
	}
	if _, err := kube.ParseObjectKey(o.servedConfigMap); o.served == "" && err != nil {
		return exitcode.InputError(fmt.Errorf("--served-configmap %w", err))
	}
	sel, err := labels.Parse(o.namespaceSelector)
	if err != nil {
		return exitcode.InputError(fmt.Errorf("--namespace-selector %q: %w", o.namespaceSelector, err))
	}
	mgmt, err := values.LoadFiles(o.valueFiles...)
	if err != nil {
		return exitcode.InputError(err)
	}
	proposedCatalog, err := proposedCatalog(ctx, o, mgmt)
	if err != nil {
		return err
	}
	proposal, selErr := plan.Propose(mgmt, proposedCatalog)
	if selErr != nil {
		fmt.Fprintf(stderr, "warning: the proposed values select with problems (the image server would serve the rest):\n%v\n", selErr)
	}

	var current osimage.ServedSet
	var inputs []fleet.Inputs
	if o.served != "" {
		doc, err := osimage.ReadValuesDocument(o.served)
		if err != nil {
			return exitcode.InputError(fmt.Errorf("--served: %w", err))
		}
		if current, err = osimage.ParseServed(doc); err != nil {
			return exitcode.InputError(fmt.Errorf("--served %s: %w", o.served, err))
		}
		if inputs, err = clustersFromFiles(o.clusters); err != nil {
			return exitcode.InputError(err)
		}
	} else {
		cluster, err := kube.NewTarget(o.kubeconfig)
		if err != nil {
			return exitcode.InputError(err)
		}
		doc, err := cluster.ConfigMapData(ctx, o.servedConfigMap, osimage.ValuesKey)
		if err != nil {
			return exitcode.FailureError(err)
		}
		if current, err = osimage.ParseServed(doc); err != nil {
			return exitcode.FailureError(fmt.Errorf("ConfigMap %s: %w", o.servedConfigMap, err))
		}
		if inputs, err = plan.ReadClusters(ctx, cluster.Config, sel); err != nil {
			return exitcode.FailureError(err)
		}
	}

	var fleetNeeds *servedset.FleetPolicy
	if o.fleetNeeds.serve {
		fleetNeeds = &policy
	}
	failing := 0
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tVERDICT")
	for _, c := range proposal.Against(current, inputs, fleetNeeds) {
		for _, line := range c.Lines {
			fmt.Fprintf(tw, "%s\t%s\n", c.Namespace, line)
		}
		if c.Fails {
			failing++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failing > 0 {
		return exitcode.FailureError(fmt.Errorf("%d of %d workload clusters would fail to render with the proposed management values, or cannot be told", failing, len(inputs)))
	}
	return nil
}

// proposedCatalog is the management catalog of the proposed values: that
// of --os-images, or the values' own, resolved.
func proposedCatalog(ctx context.Context, o planOptions, mgmt values.Values) (osimage.Catalog, error) {
	if o.osImages != "" {
		doc, err := osimage.ReadValuesDocument(o.osImages)
		if err != nil {
			return nil, exitcode.InputError(fmt.Errorf("--os-images: %w", err))
		}
		cat, err := osimage.ParseInfo(doc)
		if err != nil {
			return nil, exitcode.InputError(fmt.Errorf("--os-images %s: %w", o.osImages, err))
		}
		return cat, nil
	}
	p, err := catalog.PlanFromValues(mgmt, nil)
	if err != nil {
		return nil, exitcode.InputError(err)
	}
	client, err := oci.NewClient(oci.Options{Insecure: p.Insecure, CAFile: o.registry.CAFile, RegistryConfig: o.registry.RegistryConfig})
	if err != nil {
		return nil, exitcode.InputError(err)
	}
	cat, err := catalog.Resolve(ctx, p, client, catalog.ResolveOptions{Timeout: o.timeout, Signatures: signature.Verifier{Client: client}})
	if err != nil {
		return nil, exitcode.FailureError(fmt.Errorf("resolving the proposed catalog: %w", err))
	}
	return cat, nil
}

// clustersFromFiles reads the workload clusters of --cluster NS=FILE[,FILE].
func clustersFromFiles(specs []string) ([]fleet.Inputs, error) {
	var out []fleet.Inputs
	for _, spec := range specs {
		ns, files, ok := strings.Cut(spec, "=")
		if !ok || ns == "" || files == "" {
			return nil, fmt.Errorf("--cluster %q: want NAMESPACE=values.yaml[,more.yaml]", spec)
		}
		v, err := values.LoadFiles(strings.Split(files, ",")...)
		if err != nil {
			return nil, fmt.Errorf("--cluster %s: %w", ns, err)
		}
		out = append(out, fleet.Inputs{Namespace: ns, Clusters: []fleet.ClusterValues{{Source: files, Values: v}}})
	}
	return out, nil
}
