package fleet

import (
	"fmt"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Verdict is what a proposed served set would do to one cluster.
type Verdict string

// The verdicts, from best to worst.
const (
	Unchanged   Verdict = "unchanged"
	NewlyServed Verdict = "newly served"
	WouldFail   Verdict = "would fail"
	CannotTell  Verdict = "cannot tell"
)

var rank = map[Verdict]int{Unchanged: 0, NewlyServed: 1, CannotTell: 2, WouldFail: 3}

// PlanLine is one needed image under the proposed served set.
type PlanLine struct {
	Verdict Verdict
	Image   string // sha256/key
	Detail  string
	By      []string
}

// ClusterPlan is the verdict for one namespace.
type ClusterPlan struct {
	Namespace string
	Verdict   Verdict
	Lines     []PlanLine
	Errors    []string
}

// Plan compares what a namespace needs under the current and the proposed
// served sets. Selection decides the served set; availability comes later
// from the download, so an image the proposal selects counts as served.
func Plan(namespace string, needs []Need, current, proposed osimage.ServedSet, needErr error) ClusterPlan {
	p := ClusterPlan{Namespace: namespace, Verdict: Unchanged}
	for _, img := range group(needs) {
		name := img.SHA256 + "/" + img.ImageKey
		_, now := current[img.SHA256]
		_, then := proposed[img.SHA256]
		line := PlanLine{Image: name, By: img.NeededBy}
		switch {
		case !then && now:
			line.Verdict, line.Detail = WouldFail, fmt.Sprintf("%s no longer served", name)
		case !then:
			line.Verdict, line.Detail = WouldFail, fmt.Sprintf("%s not served (not served today either)", name)
		case !now:
			line.Verdict, line.Detail = NewlyServed, name
		default:
			line.Verdict, line.Detail = Unchanged, name
		}
		p.Lines = append(p.Lines, line)
		p.worsen(line.Verdict)
	}
	if needErr != nil {
		for _, e := range splitJoined(needErr) {
			p.Errors = append(p.Errors, e.Error())
		}
		p.worsen(CannotTell)
	}
	return p
}

func (p *ClusterPlan) worsen(v Verdict) {
	if rank[v] > rank[p.Verdict] {
		p.Verdict = v
	}
}
