package plan

import (
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

// explain adds, for one namespace, the images served because the fleet
// needs them, and the reason of each refusal next to its failure.
func (f planFleetNeeds) explain(namespace string, p fleet.ClusterPlan, lines []string) []string {
	var out []string
	for _, line := range lines {
		if line == string(fleet.Unchanged) {
			continue
		}
		if image, ok := strings.CutPrefix(line, "newly served: "); ok && f.adds(image) {
			continue
		}
		for _, r := range f.refused {
			if r.Namespace == namespace && strings.HasPrefix(line, "would fail: "+string(r.SHA256)) && (r.SHA256 == "" || strings.HasPrefix(line, "would fail: "+string(r.SHA256)+"/")) {
				line += "; serve --serve-fleet-needs would refuse it: " + r.Message
			}
		}
		out = append(out, line)
	}
	for _, l := range p.Lines {
		if f.adds(l.Image) {
			out = append(out, "served for the fleet's needs: "+l.Image)
		}
	}
	if len(out) == 0 {
		out = append(out, string(fleet.Unchanged))
	}
	return out
}

// adds says whether the image of a plan line ("<sha256>/<key>") is served
// for the fleet's needs.
func (f planFleetNeeds) adds(image string) bool {
	raw, _, _ := strings.Cut(image, "/")
	sha, err := osimage.ParseSHA256(raw)
	if err != nil {
		return false
	}
	_, added := f.added[sha]
	return added
}
