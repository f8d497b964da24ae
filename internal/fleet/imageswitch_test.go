package fleet

import (
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// An upgrade of a cluster's own image (its values now pick another image
// than its templates hold) rolls its nodes, and the plan says so before
// render does it, whether or not the served set changes; a cluster whose
// values give what its objects hold, or that has no object yet, does not
// roll.
func TestPlanSaysAnImageUpgradeRolls(t *testing.T) {
	old, upgraded := osimage.SHA256(sum("old")), osimage.SHA256(sum("new"))
	served := osimage.ServedSet{old: {Available: true}, upgraded: {Available: true}}
	proposed := osimage.ServedOutput{Set: served}
	tpl := Need{SHA256: old, ImageKey: "v1", By: "Metal3MachineTemplate wc/wc-cp-1", Live: true}
	m3m := Need{SHA256: old, ImageKey: "v1", By: "Metal3Machine wc/wc-1", Live: true}
	pick := func(sha osimage.SHA256, key string) Need {
		return Need{SHA256: sha, ImageKey: key, By: "ConfigMap wc/cluster-values .capm3"}
	}
	for _, c := range []struct {
		name  string
		needs []Need
		want  Verdict
	}{
		{"upgrade", []Need{tpl, m3m, pick(upgraded, "v2")}, Rolls},
		{"same image", []Need{tpl, m3m, pick(old, "v1")}, Unchanged},
		{"no object yet", []Need{pick(upgraded, "v2")}, Unchanged},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Plan("wc", c.needs, served, proposed, nil)
			if p.Verdict != c.want {
				t.Fatalf("verdict %q, want %q: %+v", p.Verdict, c.want, p)
			}
			if c.want != Rolls {
				return
			}
			var line *PlanLine
			for i := range p.Lines {
				if p.Lines[i].Verdict == Rolls {
					line = &p.Lines[i]
				}
			}
			if line == nil || line.Image != string(upgraded)+"/v2" ||
				!strings.Contains(line.Detail, "its Metal3 objects hold "+string(old)+"/v1") ||
				strings.Join(line.By, ", ") != "ConfigMap wc/cluster-values .capm3, Metal3MachineTemplate wc/wc-cp-1, Metal3Machine wc/wc-1" {
				t.Errorf("want the roll to v2 said, naming the old image and who holds it: %+v", p.Lines)
			}
		})
	}
}
