// Package plan tells, before a management upgrade, what the proposed
// management values would do to each workload cluster: the served set they
// would give (their catalog, then the image server's selection) against
// what each cluster uses or will use.
package plan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selection"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// Options are those of `osimages plan`, as its flags give them.
type Options struct {
	// ValueFiles are the proposed management values.
	ValueFiles []string
	// OSImages gives the proposed catalog instead of resolving it.
	OSImages string
	// Served and Clusters (NS=FILE[,FILE]) give the current served set and
	// the workload clusters from files; without them they are read from
	// the cluster: ServedConfigMap (NS/NAME) and the namespaces matching
	// NamespaceSelector.
	Served            string
	Clusters          []string
	ServedConfigMap   string
	Kubeconfig        string
	NamespaceSelector string
	Registry          oci.Options
	Timeout           time.Duration
	// FleetNeeds, when Serve, adds to the proposed set what the fleet
	// needs within that policy, as serve --serve-fleet-needs would
	// (fleetneeds.go).
	FleetNeeds selection.FleetOptions
}

// Run prints on stdout, for each workload cluster, what the proposed
// management values of o would do to it; warnings go to stderr. A cluster
// that would fail, or cannot be told, makes it an exitcode.FailureError.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	if (o.Served == "") != (len(o.Clusters) == 0) {
		return exitcode.InputError(errors.New("give --served and --cluster together (all inputs from files), or neither (read them from the cluster)"))
	}
	if err := o.FleetNeeds.Check(); err != nil {
		return exitcode.InputError(err)
	}
	if o.Timeout <= 0 {
		return exitcode.InputError(fmt.Errorf("--timeout %s: give a positive duration, such as 60s", o.Timeout))
	}
	if _, err := kube.ParseObjectKey(o.ServedConfigMap); o.Served == "" && err != nil {
		return exitcode.InputError(fmt.Errorf("--served-configmap %w", err))
	}
	sel, err := labels.Parse(o.NamespaceSelector)
	if err != nil {
		return exitcode.InputError(fmt.Errorf("--namespace-selector %q: %w", o.NamespaceSelector, err))
	}
	mgmt, err := values.LoadFiles(o.ValueFiles...)
	if err != nil {
		return exitcode.InputError(err)
	}
	proposedCatalog, err := proposedCatalog(ctx, o, mgmt)
	if err != nil {
		return err
	}
	wanted, selErr := selection.Select(mgmt, proposedCatalog)
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
	if o.Served != "" {
		doc, err := osimage.ReadValuesDocument(o.Served)
		if err != nil {
			return exitcode.InputError(fmt.Errorf("--served: %w", err))
		}
		if current, err = osimage.ParseServed(doc); err != nil {
			return exitcode.InputError(fmt.Errorf("--served %s: %w", o.Served, err))
		}
		if inputs, err = clustersFromFiles(o.Clusters); err != nil {
			return exitcode.InputError(err)
		}
	} else {
		cluster, err := kube.NewTarget(o.Kubeconfig)
		if err != nil {
			return exitcode.InputError(err)
		}
		doc, err := cluster.ConfigMapData(ctx, o.ServedConfigMap, osimage.ValuesKey)
		if err != nil {
			return exitcode.FailureError(err)
		}
		if current, err = osimage.ParseServed(doc); err != nil {
			return exitcode.FailureError(fmt.Errorf("ConfigMap %s: %w", o.ServedConfigMap, err))
		}
		if inputs, err = clustersFromAPI(ctx, cluster, sel); err != nil {
			return exitcode.FailureError(err)
		}
	}

	fleetNeeds := o.fleetNeeds(mgmt, inputs, wanted, proposed)
	failing := 0
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tVERDICT")
	for _, in := range inputs {
		needs, err := fleet.Needs(in)
		p := fleet.Plan(in.Namespace, needs, current, proposed, err)
		lines := planLines(p)
		if o.FleetNeeds.Serve {
			lines = fleetNeeds.explain(in.Namespace, p, lines)
		}
		for _, line := range lines {
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
		return exitcode.FailureError(fmt.Errorf("%d of %d workload clusters would fail to render with the proposed management values, or cannot be told", failing, len(inputs)))
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

// proposedCatalog is the management catalog of the proposed values.
func proposedCatalog(ctx context.Context, o Options, mgmt values.Values) (osimage.Catalog, error) {
	if o.OSImages != "" {
		doc, err := osimage.ReadValuesDocument(o.OSImages)
		if err != nil {
			return nil, exitcode.InputError(fmt.Errorf("--os-images: %w", err))
		}
		cat, err := osimage.ParseInfo(doc)
		if err != nil {
			return nil, exitcode.InputError(fmt.Errorf("--os-images %s: %w", o.OSImages, err))
		}
		return cat, nil
	}
	plan, err := catalog.PlanFromValues(mgmt, nil)
	if err != nil {
		return nil, exitcode.InputError(err)
	}
	client, err := oci.NewClient(oci.Options{Insecure: plan.Insecure, CAFile: o.Registry.CAFile, RegistryConfig: o.Registry.RegistryConfig})
	if err != nil {
		return nil, exitcode.InputError(err)
	}
	cat, err := catalog.Resolve(ctx, plan, client, catalog.ResolveOptions{Timeout: o.Timeout, Signatures: signature.Verifier{Client: client}})
	if err != nil {
		return nil, exitcode.FailureError(fmt.Errorf("resolving the proposed catalog: %w", err))
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
func clustersFromAPI(ctx context.Context, k *kube.Target, sel labels.Selector) ([]fleet.Inputs, error) {
	c, err := client.New(k.Config, client.Options{})
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
