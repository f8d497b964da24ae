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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/controller"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/server"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

type planOptions struct {
	valueFiles        []string
	osImages          string
	served            string
	servedCM          string
	clusters          []string
	kubeconfig        string
	namespaceSelector string
	caFile            string
	registryConfig    string
	timeout           time.Duration
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
	f.StringVar(&o.servedCM, "served-configmap", osimage.ServedConfigMapNamespace+"/"+osimage.ServedConfigMapName, "the image server's output ConfigMap, NS/NAME")
	f.StringArrayVar(&o.clusters, "cluster", nil, "a workload cluster from files, NS=values.yaml[,more.yaml]; repeat for each (then the cluster is not read)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config or in-cluster)")
	f.StringVar(&o.namespaceSelector, "namespace-selector", controller.WorkloadClusterLabel, "label selector of the workload-cluster namespaces")
	addRegistryFlags(f, &o.caFile, &o.registryConfig)
	f.DurationVar(&o.timeout, "timeout", 60*time.Second, "time allowed to resolve one image of the proposed catalog")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}

func runPlan(ctx context.Context, o planOptions, stdout, stderr io.Writer) error {
	if (o.served == "") != (len(o.clusters) == 0) {
		return inputError(errors.New("give --served and --cluster together (all inputs from files), or neither (read them from the cluster)"))
	}
	mgmt, err := values.LoadFiles(o.valueFiles...)
	if err != nil {
		return inputError(err)
	}
	proposedCatalog, err := planCatalog(ctx, o, mgmt)
	if err != nil {
		return err
	}
	wanted, selErr := server.Select(mgmt, proposedCatalog)
	if selErr != nil {
		fmt.Fprintf(stderr, "warning: the proposed values select with problems (the image server would serve the rest):\n%v\n", selErr)
	}
	proposed := osimage.ServedOutput{Set: osimage.ServedSet{}, Filenames: osimage.ServedFilenames{}}
	for sha, w := range wanted {
		proposed.Set[sha] = osimage.ServedImage{Available: true, ImageKey: w.Key}
		proposed.Filenames[sha] = w.ServedAs()
	}

	var current osimage.ServedSet
	var inputs []fleet.Inputs
	if o.served != "" {
		doc, err := osimage.ReadValuesDocument(o.served)
		if err != nil {
			return inputError(fmt.Errorf("--served: %w", err))
		}
		if current, err = osimage.ParseServed(doc); err != nil {
			return inputError(fmt.Errorf("--served %s: %w", o.served, err))
		}
		if inputs, err = clustersFromFiles(o.clusters); err != nil {
			return inputError(err)
		}
	} else {
		sel, err := labels.Parse(o.namespaceSelector)
		if err != nil {
			return inputError(fmt.Errorf("--namespace-selector %q: %w", o.namespaceSelector, err))
		}
		cluster, err := newKubeTarget(o.kubeconfig)
		if err != nil {
			return inputError(err)
		}
		doc, err := cluster.configMapValues(ctx, o.servedCM)
		if err != nil {
			return failureError(err)
		}
		if current, err = osimage.ParseServed(doc); err != nil {
			return failureError(fmt.Errorf("ConfigMap %s: %w", o.servedCM, err))
		}
		if inputs, err = clustersFromAPI(ctx, cluster, sel); err != nil {
			return failureError(err)
		}
	}

	failing := 0
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tVERDICT")
	for _, in := range inputs {
		needs, err := fleet.Needs(in)
		p := fleet.Plan(in.Namespace, needs, current, proposed, err)
		for _, line := range planLines(p) {
			fmt.Fprintf(tw, "%s\t%s\n", in.Namespace, line)
		}
		if p.Verdict == fleet.WouldFail || p.Verdict == fleet.CannotTell {
			failing++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failing > 0 {
		return failureError(fmt.Errorf("%d of %d workload clusters would fail to render with the proposed management values, or cannot be told", failing, len(inputs)))
	}
	return nil
}

// planLines says what happens to one cluster: its worst news first.
func planLines(p fleet.ClusterPlan) []string {
	var out []string
	for _, l := range p.Lines {
		if l.Verdict == fleet.WouldFail {
			out = append(out, fmt.Sprintf("would fail: %s (needed by %s)", l.Detail, strings.Join(l.By, ", ")))
		}
	}
	for _, e := range p.Errors {
		out = append(out, "cannot tell: "+strings.ReplaceAll(e, "\n", "; "))
	}
	for _, l := range p.Lines {
		if l.Verdict == fleet.NewlyServed {
			out = append(out, "newly served: "+l.Detail)
		}
	}
	if len(out) == 0 {
		out = append(out, string(fleet.Unchanged))
	}
	return out
}

// planCatalog is the management catalog of the proposed values.
func planCatalog(ctx context.Context, o planOptions, mgmt values.Values) (osimage.Catalog, error) {
	if o.osImages != "" {
		doc, err := osimage.ReadValuesDocument(o.osImages)
		if err != nil {
			return nil, inputError(fmt.Errorf("--os-images: %w", err))
		}
		cat, err := osimage.ParseInfo(doc)
		if err != nil {
			return nil, inputError(fmt.Errorf("--os-images %s: %w", o.osImages, err))
		}
		return cat, nil
	}
	plan, err := catalog.PlanFromValues(mgmt, nil)
	if err != nil {
		return nil, inputError(err)
	}
	client, err := oci.NewClient(oci.Options{Insecure: plan.Insecure, CAFile: o.caFile, RegistryConfig: o.registryConfig})
	if err != nil {
		return nil, inputError(err)
	}
	cat, err := catalog.Resolve(ctx, plan, client, catalog.ResolveOptions{Timeout: o.timeout, Signatures: signature.Verifier{Client: client}})
	if err != nil {
		return nil, failureError(fmt.Errorf("resolving the proposed catalog: %w", err))
	}
	return cat, nil
}

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

// clustersFromAPI reads what the check controller reads, once.
func clustersFromAPI(ctx context.Context, k *kubeTarget, sel labels.Selector) ([]fleet.Inputs, error) {
	c, err := client.New(k.config, client.Options{})
	if err != nil {
		return nil, err
	}
	var nss corev1.NamespaceList
	if err := c.List(ctx, &nss, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("listing workload-cluster namespaces: %w", err)
	}
	kinds, err := metal3.ServedKinds(c.RESTMapper())
	if err != nil {
		return nil, err
	}
	var out []fleet.Inputs
	for _, ns := range nss.Items {
		// The served copy is not read: the plan compares with the source.
		gathered, err := fleet.Read(ctx, c, ns.Name, fleet.ReadOptions{Metal3: kinds})
		if err != nil {
			return nil, err
		}
		out = append(out, gathered.Inputs)
	}
	return out, nil
}
