package fleet

import (
	"fmt"
	"strings"

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
// from the download, so an image the proposal selects counts as served,
// but only under the filenames the proposal serves it under: another
// filename would answer 404.
func Plan(namespace string, needs []Need, current osimage.ServedSet, proposed osimage.ServedOutput, needErr error) ClusterPlan {
	p := ClusterPlan{Namespace: namespace, Verdict: Unchanged}
	for _, img := range group(needs) {
		name := string(img.SHA256) + "/" + img.ImageKey
		_, now := current[img.SHA256]
		_, then := proposed.Set[img.SHA256]
		missing := unservedFilenames(proposed.Filenames, img)
		line := PlanLine{Image: name, By: img.NeededBy}
		switch {
		case then && len(missing) > 0:
			line.Verdict, line.Detail = WouldFail, fmt.Sprintf("%s not served under the filename %s (/images/%s/%s would answer 404; the proposed management os_images names it only as %s)",
				name, strings.Join(missing, ", "), img.SHA256, missing[0], strings.Join(proposed.Filenames[img.SHA256], ", "))
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
