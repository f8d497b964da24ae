package capm3

import (
	"maps"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// TestPickingNeedsNoClusterName: the image server and the fleet check pick
// images with the cluster's levels, and name no template, so a values
// document without `name` (the chart's `cluster:` for the management
// cluster) is no error for them; rendering still needs it.
func TestPickingNeedsNoClusterName(t *testing.T) {
	v := vals(t, "name: null")
	choices, err := levels.Choices(v)
	if err != nil {
		t.Fatalf("LevelChoices without a cluster name: %v", err)
	}
	if len(choices) != 3 {
		t.Errorf("%d level choices, want 3", len(choices))
	}
	if _, err := levels.Picks(v, testCatalog()); err != nil {
		t.Errorf("Picks without a cluster name: %v", err)
	}
	_, err = Render(Input{Values: v, Catalog: testCatalog(), Served: servedAll()})
	if err == nil || !strings.Contains(err.Error(), ".name: the cluster name must be set") {
		t.Errorf("Render without a cluster name: %v, want the name error", err)
	}
	_, err = Render(Input{Values: vals(t, "name: [c1]"), Catalog: testCatalog(), Served: servedAll()})
	if err == nil || !strings.Contains(err.Error(), ".name: must be a string") || strings.Contains(err.Error(), "must be set") {
		t.Errorf("Render with a list as name: %v, want one type error", err)
	}
}

// TestChecksumIsHexForAnyFilename: Ironic compares the file name in a
// checksum file with the image URL's last path segment without unescaping
// it, so for a filename that must be escaped in the URL a checksum URL
// could never match. Render therefore always gives the checksum as the hex
// value, and escapes the filename in the image URL so that the server finds
// the file.
func TestChecksumIsHexForAnyFilename(t *testing.T) {
	for _, name := range []string{"ubuntu+rke2.raw", "ubuntu(1).raw", "ubuntu plain.raw", "ubuntu#1.raw", "ubuntu?.raw", "ubuntu%20.raw"} {
		t.Run(name, func(t *testing.T) {
			cat := testCatalog()
			for k, img := range cat {
				img = maps.Clone(img)
				img[osimage.FieldFilename] = name
				cat[k] = img
			}
			templates, err := Render(Input{Values: vals(t), Catalog: cat, Served: servedAll()})
			if err != nil {
				t.Fatal(err)
			}
			for _, tpl := range templates {
				spec := tpl.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
				image := spec["image"].(map[string]any)
				sum := cat[tpl.ImageKey].Get(osimage.FieldSHA256)
				if image["checksum"] != sum || image["checksumType"] != "sha256" {
					t.Errorf("%s: checksum %v (%v), want the hex sha256 %s", tpl.Level, image["checksum"], image["checksumType"], sum)
				}
				u, err := url.Parse(image["url"].(string))
				if err != nil {
					t.Fatalf("%s: url %q: %v", tpl.Level, image["url"], err)
				}
				if u.RawQuery != "" || u.Fragment != "" || path.Base(u.Path) != name || u.Path != "/images/"+sum+"/"+name {
					t.Errorf("%s: url %q does not lead to /images/%s/%s (path %q, query %q, fragment %q)", tpl.Level, image["url"], sum, name, u.Path, u.RawQuery, u.Fragment)
				}
			}
		})
	}
}
