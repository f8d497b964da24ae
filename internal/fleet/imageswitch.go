package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// imageSwitches are the images a cluster's values now give that none of
// its Metal3 objects holds, while its Metal3 objects hold images that the
// values no longer give: an upgrade of the cluster's own image. Serving
// decides nothing here (Plan says whether each image is served); what it
// tells is that the next render writes new Metal3MachineTemplates, and
// the hosts made from the old ones are provisioned again. A cluster with
// no Metal3 object yet has nothing to roll.
func imageSwitches(needs []Need) []PlanLine {
	type image struct {
		key string
		by  []string
	}
	live, picked := map[osimage.SHA256]*image{}, map[osimage.SHA256]*image{}
	for _, n := range needs {
		m := picked
		if n.Live {
			m = live
		}
		img := m[n.SHA256]
		if img == nil {
			img = &image{}
			m[n.SHA256] = img
		}
		if img.key == "" {
			img.key = n.ImageKey
		}
		img.by = append(img.by, n.By)
	}
	var gone, goneBy []string
	for _, sha := range slices.Sorted(maps.Keys(live)) {
		if picked[sha] == nil {
			gone = append(gone, string(sha)+"/"+live[sha].key)
			goneBy = append(goneBy, live[sha].by...)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	var out []PlanLine
	for _, sha := range slices.Sorted(maps.Keys(picked)) {
		if live[sha] != nil {
			continue
		}
		name := string(sha) + "/" + picked[sha].key
		out = append(out, PlanLine{Verdict: Rolls, Image: name, By: append(slices.Clone(picked[sha].by), goneBy...),
			Detail: fmt.Sprintf("%s: the cluster values now give it, and its Metal3 objects hold %s: the next render writes new Metal3MachineTemplates, and their hosts are provisioned again with it",
				name, strings.Join(gone, ", "))})
	}
	return out
}
