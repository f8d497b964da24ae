package selector

import (
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

var testCatalog = osimage.Catalog{
	"ubuntu-noble-plain":    {"os": "ubuntu", "hardened": "false"},
	"ubuntu-noble-hardened": {"os": "ubuntu", "hardened": "true"},
	"opensuse-plain":        {"os": "opensuse", "hardened": "false"},
}

func TestPick(t *testing.T) {
	tests := []struct {
		name    string
		sel     map[string]any
		cat     osimage.Catalog
		want    string
		errWant string // the error must start with it
		errHas  string
	}{
		{name: "one match", sel: map[string]any{"os": "ubuntu", "hardened": true}, cat: testCatalog, want: "ubuntu-noble-hardened"},
		{
			name: "no match", sel: map[string]any{"os": "debian"}, cat: testCatalog,
			errWant: ".ctx: no OS image could be found matching selectors", errHas: "{os: debian}",
		},
		{
			name: "empty catalog", sel: map[string]any{}, cat: osimage.Catalog{},
			errWant: ".ctx: os_images is empty",
		},
		{
			name: "two matches, no tie-breaking", sel: map[string]any{"os": "ubuntu"}, cat: testCatalog,
			errWant: ".ctx: we need one OS image, but 2 were found matching selectors",
			errHas:  "ubuntu-noble-hardened, ubuntu-noble-plain",
		},
		{
			name: "three matches", sel: map[string]any{}, cat: testCatalog,
			errWant: ".ctx: we need one OS image, but 3 were found matching selectors",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Pick(mustParse(t, tt.sel), tt.cat, ".ctx")
			if tt.errWant != "" {
				if err == nil {
					t.Fatalf("picked %s, want an error", got)
				}
				if !strings.HasPrefix(err.Error(), tt.errWant) || !strings.Contains(err.Error(), tt.errHas) {
					t.Errorf("error %q, want %q ... %q", err, tt.errWant, tt.errHas)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Pick = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	sel := func(m map[string]any) *Selector { s := mustParse(t, m); return &s }
	tests := []struct {
		name     string
		imageKey string
		sel      *Selector
		want     string
		errWant  string
	}{
		{name: "image_key", imageKey: "opensuse-plain", want: "opensuse-plain"},
		{name: "image_key unknown", imageKey: "debian", errWant: ".ctx: nothing in os_images for image_key debian"},
		{name: "selector", sel: sel(map[string]any{"os": "opensuse"}), want: "opensuse-plain"},
		{name: "both agree", imageKey: "opensuse-plain", sel: sel(map[string]any{"os": "opensuse"}), want: "opensuse-plain"},
		{
			name: "both differ", imageKey: "ubuntu-noble-plain", sel: sel(map[string]any{"os": "opensuse"}),
			errWant: ".ctx: both .os_image_selector and .image_key are set, but the resulting image key differ",
		},
		{
			name: "both, selector ambiguous", imageKey: "ubuntu-noble-plain", sel: sel(map[string]any{"os": "ubuntu"}),
			errWant: ".ctx: we need one OS image, but 2 were found matching selectors",
		},
		{
			// As Sylva: the selector picks, then the keys are compared.
			name: "both, image_key unknown", imageKey: "debian", sel: sel(map[string]any{"os": "opensuse"}),
			errWant: ".ctx: both .os_image_selector and .image_key are set, but the resulting image key differ",
		},
		{name: "neither", errWant: ".ctx: neither .image_key nor .os_image_selector is set"},
		{name: "empty selector is a selector", sel: sel(map[string]any{}), errWant: ".ctx: we need one OS image, but 3 were found"},
		{
			name: "image_key is not a regexp", imageKey: "opensuse-.*",
			errWant: ".ctx: nothing in os_images for image_key opensuse-.*",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(testCatalog, tt.imageKey, tt.sel, ".ctx")
			if tt.errWant != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.errWant) {
					t.Fatalf("Resolve = %q, %v; want error %q", got, err, tt.errWant)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Resolve = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
