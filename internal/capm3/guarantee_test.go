package capm3

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Contract §8: with (A) fixed, no change of (B) that still serves the
// picked images changes a byte of the output.
func TestServedSetCannotChangeOutput(t *testing.T) {
	_, want := render(t, Input{Values: vals(t), Catalog: testCatalog(), Served: servedAll()})
	picked := []string{sha('a'), sha('b'), sha('c')}
	onlyPicked := func(keyPrefix string) osimage.ServedSet {
		b := osimage.ServedSet{}
		for _, s := range picked {
			b[osimage.SHA256(s)] = osimage.ServedImage{Available: true, ImageKey: keyPrefix + s[:4]}
		}
		return b
	}
	tests := []struct {
		name   string
		served osimage.ServedSet
	}{
		{name: "only the picked images", served: onlyPicked("k-")},
		{name: "other image keys in the management cluster", served: onlyPicked("renamed-")},
		{name: "same image key for all", served: func() osimage.ServedSet {
			b := onlyPicked("")
			for s := range b {
				b[s] = osimage.ServedImage{Available: true, ImageKey: "one-key"}
			}
			return b
		}()},
		{name: "new images, some not available", served: func() osimage.ServedSet {
			b := servedAll()
			b[osimage.SHA256(sha('9'))] = osimage.ServedImage{Available: true, ImageKey: "ubuntu-plain-rke2-1-32"}
			b[osimage.SHA256(sha('8'))] = osimage.ServedImage{Available: false, ImageKey: "newer"}
			return b
		}()},
		{name: "unpicked images unavailable", served: func() osimage.ServedSet {
			b := servedAll()
			for _, s := range []string{sha('d'), sha('e'), sha('f')} {
				b[osimage.SHA256(s)] = osimage.ServedImage{Available: false, ImageKey: "x"}
			}
			return b
		}()},
		{name: "the mgmt key of a picked image names another image of (A)", served: func() osimage.ServedSet {
			b := onlyPicked("")
			b[osimage.SHA256(sha('a'))] = osimage.ServedImage{Available: true, ImageKey: "opensuse-plain-rke2-1-32"}
			b[osimage.SHA256(sha('c'))] = osimage.ServedImage{Available: true, ImageKey: "ubuntu-plain-rke2-1-32"}
			return b
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got := render(t, Input{Values: vals(t), Catalog: testCatalog(), Served: tt.served})
			if !bytes.Equal(got, want) {
				t.Errorf("output changed:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// Rendering must not depend on map iteration order or on earlier runs.
func TestRenderIsStable(t *testing.T) {
	_, want := render(t, Input{Values: vals(t), Catalog: testCatalog(), Served: servedAll()})
	for range 50 {
		_, got := render(t, Input{Values: vals(t), Catalog: testCatalog(), Served: servedAll()})
		if !bytes.Equal(got, want) {
			t.Fatalf("output changed between runs:\n%s\nwant:\n%s", got, want)
		}
	}
}

// A change of (A) that concerns one machine deployment renames its
// template only: the others keep their names, so only its machines roll.
func TestCatalogChangeRenamesOnlyItsTemplate(t *testing.T) {
	before, _ := render(t, Input{Values: vals(t), Catalog: testCatalog(), Served: servedAll()})
	tests := []struct {
		name   string
		change func(osimage.Catalog)
	}{
		{name: "new build of md0's image", change: func(c osimage.Catalog) {
			c["ubuntu-hardened-rke2-1-32"]["sha256"] = sha('9')
		}},
		{name: "md0's image in another format", change: func(c osimage.Catalog) {
			c["ubuntu-hardened-rke2-1-32"]["image-format"] = "qcow2"
		}},
		{name: "md0's image replaced under a new key", change: func(c osimage.Catalog) {
			img := c["ubuntu-hardened-rke2-1-32"]
			delete(c, "ubuntu-hardened-rke2-1-32")
			img = img.Clone()
			img["sha256"] = sha('9')
			img["filename"] = "ubuntu-hardened-v2.raw"
			c["ubuntu-hardened-rke2-1-32-v2"] = img
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cat := testCatalog()
			tt.change(cat)
			served := servedAll()
			served[osimage.SHA256(sha('9'))] = osimage.ServedImage{Available: true, ImageKey: "new"}
			after, _ := render(t, Input{Values: vals(t), Catalog: cat, Served: served})
			for i := range before {
				changed := before[i].Name() != after[i].Name()
				if want := before[i].MachineDeployment == "md0"; changed != want {
					t.Errorf("%s: %s -> %s, want renamed=%v", before[i].Level, before[i].Name(), after[i].Name(), want)
				}
			}
		})
	}
}

// Changes outside the spec (namespace) must not rename a template.
func TestNameCoversSpecOnly(t *testing.T) {
	a, _ := render(t, Input{Values: vals(t), Catalog: testCatalog(), Served: servedAll()})
	b, _ := render(t, Input{Values: vals(t), Catalog: testCatalog(), Served: servedAll(), Namespace: "elsewhere"})
	for i := range a {
		if a[i].Name() != b[i].Name() {
			t.Errorf("%s: namespace changed the name %s -> %s", a[i].Level, a[i].Name(), b[i].Name())
		}
	}
}

// (B) without the picked image, or with it unavailable, fails the whole
// rendering with the contract's words.
func TestServedCheckFails(t *testing.T) {
	missing := servedAll()
	delete(missing, osimage.SHA256(sha('a')))
	_, err := Render(Input{Values: vals(t), Catalog: testCatalog(), Served: missing})
	want := ".control_plane.capm3: image " + sha('a') + "/ubuntu-plain-rke2-1-32 is currently not served by mgmt cluster os-image-server"
	if err == nil || err.Error() != want {
		t.Errorf("error\n got %v\nwant %s", err, want)
	}
	unavailable := servedAll()
	unavailable[osimage.SHA256(sha('a'))] = osimage.ServedImage{Available: false, ImageKey: "ubuntu-plain-rke2-1-32"}
	ts, err := Render(Input{Values: vals(t), Catalog: testCatalog(), Served: unavailable})
	if ts != nil || err == nil || strings.Contains(err.Error(), "currently not served") || !strings.Contains(err.Error(), "still being prepared (downloading)") {
		t.Errorf("unavailable image: %v, %v", ts, err)
	}
}
