package capm3

import (
	"errors"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/ocidist"
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
	want := ocidist.Reference("192.0.2.10", osimage.SHA256(sha('a')), 1048576)
	if img["url"] != want.String() || img["format"] != "raw" || len(img) != 2 {
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
	noSize := sizedCatalog()
	delete(noSize["ubuntu-plain-rke2-1-32"], "size")
	badSize := sizedCatalog()
	badSize["ubuntu-plain-rke2-1-32"]["size"] = "lots"
	notServed := servedAll()
	delete(notServed, osimage.SHA256(sha('a')))
	for _, c := range []struct {
		name, values string
		catalog      osimage.Catalog
		served       osimage.ServedSet
		want         string
	}{
		{"unknown delivery", "capm3: {image_delivery: ftp}", sizedCatalog(), servedAll(), ".image_delivery: must be http (image URLs with a checksum) or oci"},
		{"no size", "capm3: {image_delivery: oci}", noSize, servedAll(), "os_images.ubuntu-plain-rke2-1-32 has no size, and an oci:// URL names the image's manifest"},
		{"a size that is no number", "capm3: {image_delivery: oci}", badSize, servedAll(), "os_images.ubuntu-plain-rke2-1-32.size"},
		{"not served", "capm3: {image_delivery: oci}", sizedCatalog(), notServed, "is currently not served by mgmt cluster os-image-server"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts, err := Render(Input{Values: vals(t, c.values), Catalog: c.catalog, Served: c.served})
			if err == nil || ts != nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, %d templates; want an error with %q", err, len(ts), c.want)
			}
		})
	}
}

// An oci:// URL names a manifest whose digest render builds from the
// workload catalog's size, and the server from the management one's. When
// render knows what the server publishes (served-oci.yaml), a URL the
// server would answer 404 fails the render, naming both digests; before,
// the template was written and Ironic failed the host at deploy time.
func TestRenderOCIDeliveryHoldsToTheServedManifest(t *testing.T) {
	plain := osimage.SHA256(sha('a'))
	published := func(size int64) osimage.ServedOCI {
		ref := ocidist.Reference("192.0.2.10", plain, size)
		return osimage.ServedOCI{plain: {Repository: osimage.OCIRepository(plain), Manifest: ref.Manifest}}
	}
	withOthers := func(o osimage.ServedOCI) osimage.ServedOCI {
		for sum, img := range servedAll() {
			if _, ok := o[sum]; !ok && img.Available {
				ref := ocidist.Reference("192.0.2.10", sum, 1048576)
				o[sum] = osimage.OCIServed{Repository: osimage.OCIRepository(sum), Manifest: ref.Manifest}
			}
		}
		return o
	}
	values := "capm3: {image_delivery: oci}"

	// The same size on both sides: the URL is the one the server answers.
	ts, err := Render(Input{Values: vals(t, values), Catalog: sizedCatalog(), Served: servedAll(), ServedOCI: withOthers(published(1048576))})
	if err != nil {
		t.Fatalf("render with matching manifests: %v", err)
	}
	if u := field(t, ts[0].Object, "spec", "template", "spec", "image", "url"); u != ocidist.Reference("192.0.2.10", plain, 1048576).String() {
		t.Errorf("url %v", u)
	}

	// The management catalog says another size: nothing is rendered.
	other := ocidist.Reference("192.0.2.10", plain, 2097152).Manifest
	ts, err = Render(Input{Values: vals(t, values), Catalog: sizedCatalog(), Served: servedAll(), ServedOCI: withOthers(published(2097152))})
	for _, want := range []string{"image " + string(plain) + "/ubuntu-plain-rke2-1-32", "answers its oci:// URL with manifest " + other, "size of 1048576 bytes", "correct os_images.ubuntu-plain-rke2-1-32.size", "image_delivery: http"} {
		if err == nil || ts != nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("sizes that differ: got %v, %d templates; want an error with %q", err, len(ts), want)
		}
	}

	// Published, but without this image: said so.
	ts, err = Render(Input{Values: vals(t, values), Catalog: sizedCatalog(), Served: servedAll(), ServedOCI: osimage.ServedOCI{}})
	if err == nil || ts != nil || !strings.Contains(err.Error(), "publishes no oci:// reference for it") {
		t.Fatalf("no reference published: got %v, %d templates", err, len(ts))
	}

	// Image URLs do not go through the OCI API: what it publishes does not
	// matter to them.
	if _, err := Render(Input{Values: vals(t), Catalog: sizedCatalog(), Served: servedAll(), ServedOCI: withOthers(published(2097152))}); err != nil {
		t.Errorf("http delivery held to the OCI manifests: %v", err)
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
