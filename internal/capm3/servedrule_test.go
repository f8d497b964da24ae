package capm3

import (
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// Render and the fleet check apply one served-image rule
// (osimage.Image.ServedAt): an image render refuses is never a need, and
// both say why in the same words. An uppercase sha256 in a tenant's inline
// os_images used to become a need that the image server could not parse,
// which stopped it (issue 23, item 4).
func TestRenderAndTheCheckShareTheServedImageRule(t *testing.T) {
	key := "ubuntu-hardened-rke2-1-32"
	tests := []struct {
		name  string
		field string
		value any
		says  string
	}{
		{"uppercase sha256", "sha256", strings.ToUpper(sha('b')), "write it in lowercase"},
		{"short sha256", "sha256", "abc", "is not 64 lowercase hex digits"},
		{"no sha256", "sha256", "", "has no sha256"},
		{"sha256 not a string", "sha256", 12, "not a string"},
		{"filename with a path", "filename", "../x.raw", `holds "/"`},
		{"no filename", "filename", "", "has no filename"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cat := testCatalog()
			img := cat[key].Clone()
			img[tt.field] = tt.value
			// The tenant's own os_images, inline in the cluster values.
			v := vals(t)
			v["os_images"] = map[string]any{key: map[string]any(img)}

			// (A), as the render command merges it.
			a, err := osimage.MergeA(cat, v)
			if err != nil {
				t.Fatal(err)
			}
			_, renderErr := Render(Input{Values: v, Catalog: a, Served: servedAll()})
			if renderErr == nil || !strings.Contains(renderErr.Error(), tt.says) {
				t.Fatalf("render: want an error saying %q, got %v", tt.says, renderErr)
			}
			needs, needErr := fleet.Needs(fleet.Inputs{Namespace: "wc1", Catalog: cat,
				Clusters: []fleet.ClusterValues{{Source: "ConfigMap wc1/values", Values: v}}})
			if needErr == nil || !strings.Contains(needErr.Error(), tt.says) {
				t.Fatalf("check: want an error saying %q, got %v", tt.says, needErr)
			}
			// The same fault, in the same words, naming the same level.
			line := faultLine(t, renderErr.Error(), tt.says)
			if !strings.Contains(needErr.Error(), line) {
				t.Errorf("the check says %q, render %q", needErr, line)
			}
			for _, n := range needs {
				if _, err := osimage.ParseSHA256(string(n.SHA256)); err != nil {
					t.Errorf("a need the image server cannot parse: %+v", n)
				}
				if n.ImageKey == key {
					t.Errorf("an image render refuses is a need: %+v", n)
				}
			}
		})
	}
}

func faultLine(t *testing.T, msg, says string) string {
	t.Helper()
	for _, l := range strings.Split(msg, "\n") {
		if strings.Contains(l, says) {
			return l
		}
	}
	t.Fatalf("no line of %q says %q", msg, says)
	return ""
}
