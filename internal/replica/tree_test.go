package replica

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagelife"
)

func TestTreeFansOutFromTheSource(t *testing.T) {
	order := []string{"a", "b", "c", "d", "e", "f", "g"}
	none := map[string]Image{}
	// Nobody holds or pulls it: a pulls, b and c follow a, d and e follow
	// b, f and g follow c.
	want := map[string]string{"a": "a", "b": "a", "c": "a", "d": "b", "e": "b", "f": "c", "g": "c"}
	for self, parent := range want {
		if got := Tree(self, order, none, 2); got != parent {
			t.Errorf("%s fills from %s, want %s", self, got, parent)
		}
	}
	// d pulls it already (it chose itself before the others were
	// listed): it is the root, the others follow in order.
	pulling := map[string]Image{"d": {Phase: imagelife.PhaseDownloading, Source: fill.FromRegistry}}
	want = map[string]string{"a": "d", "b": "d", "c": "a", "e": "a", "f": "b", "g": "b"}
	for self, parent := range want {
		if got := Tree(self, order, pulling, 2); got != parent {
			t.Errorf("d pulling: %s fills from %s, want %s", self, got, parent)
		}
	}
	// A verified copy comes before a pull.
	verified := map[string]Image{"d": pulling["d"], "f": {Phase: imagelife.PhaseReady}}
	if got := Tree("a", order, verified, 2); got != "f" {
		t.Errorf("f holds it verified: a fills from %s", got)
	}
	// A peer that failed the image is left out: its children move up.
	failed := map[string]Image{"b": {Phase: imagelife.PhaseFailed, Source: fill.FromRegistry}}
	want = map[string]string{"a": "a", "c": "a", "d": "a", "e": "c", "f": "c", "g": "d"}
	for self, parent := range want {
		if got := Tree(self, order, failed, 2); got != parent {
			t.Errorf("b failed: %s fills from %s, want %s", self, got, parent)
		}
	}
	// A star with a fan-out as wide as the set.
	for _, self := range order[1:] {
		if got := Tree(self, order, none, len(order)); got != "a" {
			t.Errorf("fan-out %d: %s fills from %s, want a", len(order), self, got)
		}
	}
}

// TestTreeNeverLoopsAndBoundsTheFanOut: over any set, any source and any
// fan-out, every replica's parent comes before it in the tree (so that no
// two replicas follow each other, however the chain goes), and no replica
// feeds more than the fan-out when every replica sees the same set.
func TestTreeNeverLoopsAndBoundsTheFanOut(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 500 {
		n, fanOut := 1+r.IntN(12), 1+r.IntN(4)
		var ids []string
		for i := range n {
			ids = append(ids, fmt.Sprintf("r%d", i))
		}
		order := Rendezvous(fmt.Sprint(round), ids)
		images := map[string]Image{}
		if r.IntN(2) == 0 {
			images[ids[r.IntN(n)]] = Image{Phase: imagelife.PhaseDownloading, Source: fill.FromRegistry}
		}
		children := map[string]int{}
		sources := 0
		parentOf := map[string]string{}
		for _, self := range ids {
			// A replica does not see its own state among its peers'.
			peers := map[string]Image{}
			for id, img := range images {
				if id != self {
					peers[id] = img
				}
			}
			parent := Tree(self, order, peers, fanOut)
			if _, pulls := images[self]; pulls {
				// It pulls already: it chooses no source.
				parent = self
			}
			parentOf[self] = parent
			if parent == self {
				sources++
				continue
			}
			children[parent]++
		}
		for id, c := range children {
			if c > fanOut {
				t.Fatalf("round %d: %s feeds %d followers, fan-out %d: %v", round, id, c, fanOut, parentOf)
			}
		}
		if sources != 1 {
			t.Fatalf("round %d: %d replicas fill from the registry: %v", round, sources, parentOf)
		}
		for _, self := range ids {
			seen := []string{self}
			for id := parentOf[self]; id != seen[len(seen)-1]; id = parentOf[id] {
				if slices.Contains(seen, id) {
					t.Fatalf("round %d: a loop %v -> %s: %v", round, seen, id, parentOf)
				}
				seen = append(seen, id)
			}
		}
	}
}
