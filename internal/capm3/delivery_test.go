package capm3

import (
	"errors"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// sizedCatalog is testCatalog with a size for every image: an oci:// URL
// needs it.
func sizedCatalog() osimage.Catalog {
	cat := testCatalog()
	for _, img := range cat {
		img["size"] = "1048576"
	}
	return cat
}

func TestRenderOCIDelivery(t *testing.T) {
	in := Input{Values: vals(t, "capm3: {image_delivery: oci}"), Catalog: sizedCatalog(), Served: servedAll()}
	ts, _ := render(t, in)
	cp := ts[0].Object
	img := field(t, cp, "spec", "template", "spec", "image").(map[string]any)
	// The tag is the disk type, which Ironic reads from its index: a URL
	// pinned to a manifest digest is of unknown format to it.
	want := "oci://192.0.2.10/images/" + sha('a') + ":raw"
	if img["url"] != want || img["format"] != "raw" || len(img) != 2 {
		t.Fatalf("oci image block %v, want url %s, format raw and no checksum", img, want)
	}
	if ref, ok := osimage.ParseOCIReference(img["url"].(string)); !ok || ref.SHA256 != osimage.SHA256(sha('a')) {
		t.Fatalf("the URL does not name its image: %v", img["url"])
	}

	// The switch from one kind of URL to the other is a new template (the
	// nodes roll); in each mode, the name is the image's.
	httpTs, _ := render(t, Input{Values: vals(t), Catalog: sizedCatalog(), Served: servedAll()})
	if httpTs[0].Name() == ts[0].Name() {
		t.Errorf("http and oci templates share the name %s", ts[0].Name())
	}
	renamed := sizedCatalog()
	renamed["ubuntu-plain-rke2-1-32"]["filename"] = "other.raw"
	renamed["ubuntu-plain-rke2-1-32"]["oci-image-registry-key"] = "sylva"
	again, _ := render(t, Input{Values: vals(t, "capm3: {image_delivery: oci}"), Catalog: renamed, Served: servedAll()})
	if again[0].Name() != ts[0].Name() {
		t.Errorf("a renamed image changed the oci template's name: %s then %s", ts[0].Name(), again[0].Name())
	}

	// One level may move alone, and an IPv6 host gets its brackets.
	mixed, _ := render(t, Input{Values: vals(t, `
capm3: {image_provisioning_host: "2001:db8::1"}
machine_deployments:
  md0:
    capm3: {image_delivery: oci}
`), Catalog: sizedCatalog(), Served: servedAll()})
	for _, tpl := range mixed {
		u := field(t, tpl.Object, "spec", "template", "spec", "image", "url").(string)
		if oci := tpl.MachineDeployment == "md0"; oci != strings.HasPrefix(u, "oci://[2001:db8::1]/images/") || !oci && !strings.HasPrefix(u, "https://[2001:db8::1]/images/") {
			t.Errorf("%s: url %s", tpl.Level, u)
		}
	}
}

func TestRenderOCIDeliveryErrors(t *testing.T) {
	vmdk := sizedCatalog()
	vmdk["ubuntu-plain-rke2-1-32"]["image-format"] = "vmdk"
	notServed := servedAll()
	delete(notServed, osimage.SHA256(sha('a')))
	for _, c := range []struct {
		name, values string
		catalog      osimage.Catalog
		served       osimage.ServedSet
		want         string
	}{
		{"unknown delivery", "capm3: {image_delivery: ftp}", sizedCatalog(), servedAll(), ".image_delivery: must be http (image URLs with a checksum) or oci"},
		{"a format Ironic cannot take by oci://", "capm3: {image_delivery: oci}", vmdk, servedAll(), `os_images.ubuntu-plain-rke2-1-32: image-format "vmdk" cannot be delivered by oci://: Ironic reads the disk format of an oci:// image from its tag, and knows qcow2 and raw only; set .image_delivery: http`},
		{"not served", "capm3: {image_delivery: oci}", sizedCatalog(), notServed, "is currently not served by mgmt cluster os-image-server"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts, err := Render(Input{Values: vals(t, c.values), Catalog: c.catalog, Served: c.served})
			if err == nil || ts != nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, %d templates; want an error with %q", err, len(ts), c.want)
			}
		})
	}
	// The tag answers from the verified image alone: an image without a
	// size in the catalog is delivered all the same.
	noSize := sizedCatalog()
	delete(noSize["ubuntu-plain-rke2-1-32"], "size")
	if _, err := Render(Input{Values: vals(t, "capm3: {image_delivery: oci}"), Catalog: noSize, Served: servedAll()}); err != nil {
		t.Errorf("an image without a size: %v", err)
	}
}

// When render knows what the server publishes (served-oci.yaml), an image
// it publishes no oci:// reference for (a server without the OCI face)
// fails the render; the sizes of the two catalogs no longer matter, since
// the URL names the disk type's tag, not a manifest built from a size.
func TestRenderOCIDeliveryHoldsToTheServedOCI(t *testing.T) {
	plain := osimage.SHA256(sha('a'))
	published := func(size int64) osimage.ServedOCI {
		o := osimage.ServedOCI{}
		for sum, img := range servedAll() {
			if img.Available {
				_, manifest := osimage.OCIManifest(sum, size)
				o[sum] = osimage.OCIServed{Repository: osimage.OCIRepository(sum), Manifest: manifest}
			}
		}
		return o
	}
	values := "capm3: {image_delivery: oci}"
	for _, size := range []int64{1048576, 2097152} {
		ts, err := Render(Input{Values: vals(t, values), Catalog: sizedCatalog(), Served: servedAll(), ServedOCI: published(size)})
		if err != nil {
			t.Fatalf("render with the server's manifest of %d bytes: %v", size, err)
		}
		if u := field(t, ts[0].Object, "spec", "template", "spec", "image", "url"); u != "oci://192.0.2.10/images/"+string(plain)+":raw" {
			t.Errorf("url %v", u)
		}
	}

	// Published, but without this image: said so.
	ts, err := Render(Input{Values: vals(t, values), Catalog: sizedCatalog(), Served: servedAll(), ServedOCI: osimage.ServedOCI{}})
	if err == nil || ts != nil || !strings.Contains(err.Error(), "publishes no oci:// reference for it") {
		t.Fatalf("no reference published: got %v, %d templates", err, len(ts))
	}

	// Image URLs do not go through the OCI API: what it publishes does not
	// matter to them.
	if _, err := Render(Input{Values: vals(t), Catalog: sizedCatalog(), Served: servedAll(), ServedOCI: osimage.ServedOCI{}}); err != nil {
		t.Errorf("http delivery held to the OCI references: %v", err)
	}
}

// A CAPM3 that refuses oci:// images (metal3.OCIRefusal of its CRD) fails
// the levels that ask for them, each named, with the refusal; the levels
// that take image URLs are not its concern.
func TestRenderOCIDeliveryRefusedByCAPM3(t *testing.T) {
	refused := &metal3.OCIRefusedError{Version: "v1beta1"}
	ts, err := Render(Input{Values: vals(t, "capm3: {image_delivery: oci}"), Catalog: sizedCatalog(), Served: servedAll(), OCIRefused: refused})
	if ts != nil || !errors.Is(err, refused) {
		t.Fatalf("got %v, %d templates; want the refusal", err, len(ts))
	}
	for _, want := range []string{".control_plane.capm3.image_delivery: oci: ", "CAPM3 before v1.14.0", "upgrade CAPM3 to v1.14.0 or later"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := Render(Input{Values: vals(t), Catalog: sizedCatalog(), Served: servedAll(), OCIRefused: refused}); err != nil {
		t.Errorf("image URLs refused with the oci:// refusal: %v", err)
	}
}
