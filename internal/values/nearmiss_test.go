package values

import (
	"errors"
	"strings"
	"testing"
)

func TestNearMisses(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want []string // the keys found, as NearMiss.Found
		of   []string
	}{
		{"os_image: {a: {}}", []string{"os_image"}, []string{"os_images"}},
		{"os_imagez: {}", []string{"os_imagez"}, []string{"os_images"}},
		{"os-images: {}", []string{"os-images"}, []string{"os_images"}},
		{"OS_Images: {}", []string{"OS_Images"}, []string{"os_images"}},
		{"osImages: {}", []string{"osImages"}, []string{"os_images"}},
		{"os_image_server_additional_selector: {}", []string{"os_image_server_additional_selector"}, []string{"os_image_server_additional_selectors"}},
		{"os_image_server_aditional_selector: {}", []string{"os_image_server_aditional_selector"}, []string{"os_image_server_additional_selectors"}},
		{"cosign_public_key: x", []string{"cosign_public_key"}, []string{"cosign_publickey"}},
		{"os_images_oci_registry: {}", []string{"os_images_oci_registry"}, []string{"os_images_oci_registries"}},
		{"capm3s: {}", []string{"capm3s"}, []string{"capm3"}},
		// The key itself is there: the look-alike is someone else's.
		{"os_images: {}\nos_image: {}", nil, []string{"os_images"}},
		// Unknown keys as such are fine, however many.
		{"units: {}\ncluster: {}\nproxies: {}\nos_images_default_download_storage_space: 30Gi\nsylva_diskimagebuilder_version: 0.7.6", nil, []string{"os_images", "sylva_diskimagebuilder_images"}},
		// Short keys match only by case and separators: capo is not capm3.
		{"capo: {}\ncapd: {}\ncapm: {}", nil, []string{"capm3"}},
		{"CAPM3: {}", []string{"CAPM3"}, []string{"capm3"}},
		{"URL: x", []string{"URL"}, []string{"url", "tag"}},
		// Two known keys never read as a typo of one another.
		{"os_images: {}\nos_images_oci_registries: {}", nil, []string{"os_images", "os_images_oci_registries", "oci_registry_insecure"}},
	} {
		m, err := Parse([]byte(tc.doc))
		if err != nil {
			t.Fatal(err)
		}
		errs := NearMisses(m, "", tc.of...)
		var found []string
		for _, e := range errs {
			var nm *NearMiss
			if !errors.As(e, &nm) {
				t.Fatalf("%T", e)
			}
			found = append(found, nm.Found)
		}
		if strings.Join(found, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%q: near-misses %v, want %v", tc.doc, found, tc.want)
		}
	}
}

func TestNearMissMessage(t *testing.T) {
	m, _ := Parse([]byte("sylva: {cosign_public_key: x}"))
	reg, _ := Map(m, "sylva", "os_images_oci_registries.sylva")
	errs := NearMisses(reg, "os_images_oci_registries.sylva", "url", "tag", "cosign_publickey", "enabled")
	if len(errs) != 1 {
		t.Fatalf("%v", errs)
	}
	msg := errs[0].Error()
	for _, want := range []string{"os_images_oci_registries.sylva.cosign_public_key: did you mean cosign_publickey?", "os_images_oci_registries.sylva.cosign_publickey is a key osimages reads"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"abc", "abc", 0}, {"abc", "acb", 1}, {"osimage", "osimages", 1}, {"kitten", "sitting", 3}, {"", "abc", 3}} {
		if got := editDistance(tc.a, tc.b); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}
