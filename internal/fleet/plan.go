package fleet

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// Verdict is what a proposed served set would do to one cluster.
type Verdict string

// The verdicts, from best to worst.
const (
	Unchanged   Verdict = "unchanged"
	NewlyServed Verdict = "newly served"
	// Rolls: the cluster's values now give an image another kind of URL
	// (image URL or oci://) than its Metal3 objects hold, or another image
	// (imageSwitches): the next render writes new templates, and their
	// nodes roll.
	Rolls      Verdict = "rolls nodes"
	WouldFail  Verdict = "would fail"
	CannotTell Verdict = "cannot tell"
)

var rank = map[Verdict]int{Unchanged: 0, NewlyServed: 1, Rolls: 2, CannotTell: 3, WouldFail: 4}

// PlanLine is one needed image under the proposed served set.
type PlanLine struct {
	Verdict Verdict
	SHA256  osimage.SHA256 // "" for a line of no one image
	Image   string         // sha256/key
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
		line := PlanLine{SHA256: img.SHA256, Image: name, By: img.NeededBy}
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
	for _, line := range append(deliverySwitches(needs), imageSwitches(needs)...) {
		p.Lines = append(p.Lines, line)
		p.worsen(line.Verdict)
	}
	if needErr != nil {
		for _, e := range splitJoined(needErr) {
			// A CAPM3 that refuses oci:// templates is no doubt: the
			// next render of those values fails.
			var refused *metal3.OCIRefusedError
			if errors.As(e, &refused) {
				p.Lines = append(p.Lines, PlanLine{Verdict: WouldFail, Detail: e.Error(), By: []string{"its cluster values"}})
				p.worsen(WouldFail)
				continue
			}
			p.Errors = append(p.Errors, e.Error())
			p.worsen(CannotTell)
		}
	}
	return p
}

// deliverySwitches are the images that the cluster's values give Metal3
// by another kind of URL than its Metal3 objects hold: a switch between
// image URLs and oci:// changes every template of the levels concerned.
func deliverySwitches(needs []Need) []PlanLine {
	type kinds struct {
		key          string
		live, values map[string]bool
		by           []string
	}
	by := map[osimage.SHA256]*kinds{}
	for _, n := range needs {
		k := by[n.SHA256]
		if k == nil {
			k = &kinds{live: map[string]bool{}, values: map[string]bool{}}
			by[n.SHA256] = k
		}
		if k.key == "" {
			k.key = n.ImageKey
		}
		if n.Live {
			k.live[n.Delivery] = true
		} else {
			k.values[n.Delivery] = true
		}
		k.by = append(k.by, n.By)
	}
	var out []PlanLine
	for _, sha := range slices.Sorted(maps.Keys(by)) {
		k := by[sha]
		if len(k.live) == 0 || len(k.values) == 0 || maps.Equal(k.live, k.values) {
			continue
		}
		name := string(sha) + "/" + k.key
		out = append(out, PlanLine{Verdict: Rolls, SHA256: sha, Image: name, By: k.by,
			Detail: fmt.Sprintf("%s: its Metal3 objects take it by %s, and the cluster values now give it by %s: the next render writes new Metal3MachineTemplates, and their nodes roll",
				name, deliveryWords(k.live), deliveryWords(k.values))})
	}
	return out
}

// deliveryWords names kinds of URL for a plan line.
func deliveryWords(kinds map[string]bool) string {
	var words []string
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		words = append(words, map[string]string{
			levels.DeliveryHTTP: "image URLs",
			levels.DeliveryOCI:  "oci:// URLs",
			// What a render before the disk type's tag wrote: Ironic cannot
			// tell its format, and its agent copies the image into its RAM.
			levels.DeliveryOCIDigest: "oci:// URLs pinned to a manifest digest (of a disk format Ironic cannot tell)",
		}[k])
	}
	return strings.Join(words, " and ")
}

func (p *ClusterPlan) worsen(v Verdict) {
	if rank[v] > rank[p.Verdict] {
		p.Verdict = v
	}
}
