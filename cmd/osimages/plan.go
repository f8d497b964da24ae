package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/controller"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/plan"
)

func newPlanCommand() *cobra.Command {
	o := plan.Options{}
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
			return plan.Run(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.ValueFiles, "values", "f", nil, "proposed management values; repeat to merge several, later wins")
	f.StringVar(&o.OSImages, "os-images", "", "the proposed management catalog (os_images document or os-images-info manifest) instead of resolving it")
	f.StringVar(&o.Served, "served", "", "the current served set (capm3_os_image_server_images document or ConfigMap manifest) instead of reading it from the cluster")
	f.StringVar(&o.ServedConfigMap, "served-configmap", osimage.ServedConfigMapNamespace+"/"+osimage.ServedConfigMapName, "the image server's output ConfigMap, NS/NAME")
	f.StringArrayVar(&o.Clusters, "cluster", nil, "a workload cluster from files, NS=values.yaml[,more.yaml]; repeat for each (then the cluster is not read)")
	addKubeconfigFlag(f, &o.Kubeconfig)
	f.StringVar(&o.NamespaceSelector, "namespace-selector", controller.WorkloadClusterLabel, "label selector of the workload-cluster namespaces")
	addFleetNeedsFlags(f, &o.FleetNeeds, "predict what serve --serve-fleet-needs does: also serve")
	addRegistryFlags(f, &o.Registry)
	f.DurationVar(&o.Timeout, "timeout", 60*time.Second, "time allowed to resolve one image of the proposed catalog")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}
