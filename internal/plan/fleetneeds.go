package plan

import (
	"fmt"
	"strings"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/values"
)

// planFleetNeeds is what serve --serve-fleet-needs would add to the
// proposed set, and refuse.
type planFleetNeeds struct {
	added   map[osimage.SHA256]servedset.Wanted
	refused osimage.RefusedNeeds
}

// addFleetNeeds computes the fleet's needs as the controller publishes
// them (each namespace's needs with its own catalog's records), applies
// policy as serve does, and adds what it admits to proposed. Clusters
// given as files carry no catalog: their needs have no record, and are
// refused as such.
func addFleetNeeds(mgmt values.Values, inputs []fleet.Inputs, wanted map[osimage.SHA256]servedset.Wanted, proposed osimage.ServedOutput, policy servedset.FleetPolicy) planFleetNeeds {
	var all []fleet.NamespaceNeeds
	for _, in := range inputs {
		needs, _ := fleet.Needs(in)
		report := fleet.Check(in.Namespace, "", needs, osimage.ServedOutput{}, false, nil)
		all = append(all, fleet.NamespaceNeeds{Report: report, Catalog: in.Catalog})
	}
	served, refused := servedset.FleetNeeds(mgmt, fleet.Aggregate(all), wanted, nil, policy)
	added := map[osimage.SHA256]servedset.Wanted{}
	for sha, w := range served {
		if w.IsNeed() {
			added[sha] = w
			proposed.Set[sha] = osimage.ServedImage{Available: true, ImageKey: w.Key}
		}
		if _, ok := proposed.Set[sha]; ok {
			proposed.Filenames[sha] = w.ServedAs()
		}
	}
	return planFleetNeeds{added: added, refused: refused}
}

// lines says what happens to one cluster, its worst news first, with
// serve's refusal of an image beside its failure and the images served
// for the fleet's needs: each joined on (namespace, sha256).
func (f planFleetNeeds) lines(p fleet.ClusterPlan) []string {
	var out []string
	for _, l := range p.Lines {
		if l.Verdict == fleet.WouldFail {
			line := fmt.Sprintf("would fail: %s (needed by %s)", l.Detail, strings.Join(l.By, ", "))
			if r, ok := f.refused.For(p.Namespace, l.SHA256); ok {
				line += "; serve --serve-fleet-needs would refuse it: " + r.Message
			}
			out = append(out, line)
		}
	}
	for _, e := range p.Errors {
		out = append(out, "cannot tell: "+strings.ReplaceAll(e, "\n", "; "))
	}
	for _, l := range p.Lines {
		if l.Verdict == fleet.Rolls {
			out = append(out, fmt.Sprintf("rolls nodes: %s (%s)", l.Detail, strings.Join(l.By, ", ")))
		}
	}
	for _, l := range p.Lines {
		if l.Verdict == fleet.NewlyServed && !f.adds(l.SHA256) {
			out = append(out, "newly served: "+l.Detail)
		}
	}
	for _, l := range p.Lines {
		if f.adds(l.SHA256) {
			out = append(out, "served for the fleet's needs: "+l.Image)
		}
	}
	if len(out) == 0 {
		out = append(out, string(fleet.Unchanged))
	}
	return out
}

// adds says whether the image of sha is served for the fleet's needs.
func (f planFleetNeeds) adds(sha osimage.SHA256) bool {
	_, added := f.added[sha]
	return added
}
