// Package plan tells, before a management upgrade, what the proposed
// management values would do to each workload cluster: the served set they
// would give (their catalog, then the image server's selection) against
// what each cluster uses or will use. It returns what it finds; the plan
// command reads the inputs and prints it.
package plan

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/values"
)

// Proposal is what proposed management values would serve.
type Proposal struct {
	mgmt   values.Values
	wanted map[osimage.SHA256]servedset.Wanted
}

// Propose selects, as the image server would, what the proposed
// management values mgmt serve from their catalog. The error says what
// the selection had problems with; the image server would serve the rest,
// and so does the proposal.
func Propose(mgmt values.Values, catalog osimage.Catalog) (Proposal, error) {
	wanted, err := servedset.Select(mgmt, catalog)
	return Proposal{mgmt: mgmt, wanted: wanted}, err
}

// Cluster is what the proposal does to one workload cluster.
type Cluster struct {
	Namespace string
	// Lines say it, worst news first: "unchanged", "newly served: ...",
	// "would fail: ...", "cannot tell: ..." and, with the fleet's needs,
	// "served for the fleet's needs: ...".
	Lines []string
	// Fails is true when the cluster would fail to render, or its inputs
	// cannot be read.
	Fails bool
}

// Against compares the proposal with the current served set, for each
// workload cluster. With fleetNeeds, what serve --serve-fleet-needs would
// add within that policy is served too (fleetneeds.go).
func (p Proposal) Against(current osimage.ServedSet, clusters []fleet.Inputs, fleetNeeds *servedset.FleetPolicy) []Cluster {
	proposed := osimage.ServedOutput{Set: osimage.ServedSet{}, Filenames: osimage.ServedFilenames{}}
	for sha, w := range p.wanted {
		proposed.Set[sha] = osimage.ServedImage{Available: true, ImageKey: w.Key}
		proposed.Filenames[sha] = w.ServedAs()
	}
	var added planFleetNeeds
	if fleetNeeds != nil {
		added = addFleetNeeds(p.mgmt, clusters, p.wanted, proposed, *fleetNeeds)
	}
	out := make([]Cluster, 0, len(clusters))
	for _, in := range clusters {
		needs, err := fleet.Needs(in)
		cp := fleet.Plan(in.Namespace, needs, current, proposed, err)
		lines := added.lines(cp)
		out = append(out, Cluster{Namespace: in.Namespace, Lines: lines,
			Fails: cp.Verdict == fleet.WouldFail || cp.Verdict == fleet.CannotTell})
	}
	return out
}

// ReadClusters reads, once, what the check controller reads of the
// workload-cluster namespaces that sel matches.
func ReadClusters(ctx context.Context, cfg *rest.Config, sel labels.Selector) ([]fleet.Inputs, error) {
	c, err := client.New(cfg, client.Options{})
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
	// Read once: whether the installed CAPM3 refuses oci:// templates.
	ociRefused, err := metal3.ReadOCIRefusal(ctx, c)
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
		gathered.Inputs.OCIRefused = ociRefused
		out = append(out, gathered.Inputs)
	}
	return out, nil
}
