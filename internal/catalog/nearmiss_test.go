package catalog

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// TestPlanRefusesNearMisses: values whose keys the catalog reads are
// misspelt are an input error with a hint, not an empty catalog; the real
// values' hundreds of other keys stay fine.
func TestPlanRefusesNearMisses(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"os_image:\n  my-image: {uri: 'https://f/x.raw'}\n", "os_image: did you mean os_images?"},
		{"sylva_diskimagebuilder_image:\n  ubuntu: {os_images_oci_registry: sylva}\n", "sylva_diskimagebuilder_image: did you mean sylva_diskimagebuilder_images?"},
		{"os_images_oci_registry:\n  sylva: {url: 'oci://r/x', tag: '1'}\n", "os_images_oci_registry: did you mean os_images_oci_registries?"},
		{strings.Replace(baseValues, "    tag: '{{ .Values.sylva_diskimagebuilder_version }}'", "    tag: '{{ .Values.sylva_diskimagebuilder_version }}'\n    cosign_public_key: k", 1), "os_images_oci_registries.sylva.cosign_public_key: did you mean cosign_publickey?"},
		{strings.Replace(baseValues, "dropped-by-itself: {os_images_oci_registry: sylva, enabled: false}", "dropped-by-itself: {os_images_oci_registy: sylva}", 1), "sylva_diskimagebuilder_images.dropped-by-itself.os_images_oci_registy: did you mean os_images_oci_registry?"},
		{baseValues + "security:\n  os_images: {skip_signing_checks: true}\n", "security.os_images.skip_signing_checks: did you mean skip_signing_check?"},
	} {
		_, err := PlanFromValues(mustParse(t, tc.doc), nil)
		var input *InputError
		var miss *values.NearMiss
		if !errors.As(err, &input) || !errors.As(err, &miss) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: want an input error saying %q, got %v", tc.doc, tc.want, err)
		}
	}
	// Unknown keys as such are fine.
	if _, err := PlanFromValues(mustParse(t, baseValues+"units: {a: {enabled: true}}\ncluster: {capm3: {}}\nos_images_default_download_storage_space: 30Gi\n"), nil); err != nil {
		t.Errorf("unknown keys: %v", err)
	}
}

func TestConfigMapRefusesTooLarge(t *testing.T) {
	cat := osimage.Catalog{}
	for i := range 1700 {
		cat[fmt.Sprintf("image-%04d", i)] = osimage.Image{"uri": fmt.Sprintf("https://files.example.org/image-%04d.raw", i), "description": strings.Repeat("d", 600)}
	}
	_, err := ConfigMap("sylva-system", cat, "sha256:x")
	var size *osimage.SizeError
	if !errors.As(err, &size) || size.Images != 1700 || !strings.Contains(err.Error(), "ConfigMap sylva-system/os-images-info would hold") {
		t.Fatalf("want a size error, got %v", err)
	}
	for k := range cat {
		if len(cat) == 1500 {
			break
		}
		delete(cat, k)
	}
	if _, err := ConfigMap("sylva-system", cat, "sha256:x"); err != nil {
		t.Errorf("1500 images: %v", err)
	}
}

func TestCheckEmptying(t *testing.T) {
	cm := func(doc string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "os-images-info"}, Data: map[string]string{"values.yaml": doc}}
	}
	full := cm("os_images:\n  a: {uri: 'https://f/a'}\n")
	for _, tc := range []struct {
		current *corev1.ConfigMap
		images  int
		allow   bool
		refused bool
	}{
		{nil, 0, false, false},
		{cm("os_images: {}\n"), 0, false, false},
		{cm("not: [yaml"), 0, false, false},
		{full, 1, false, false},
		{full, 0, true, false},
		{full, 0, false, true},
	} {
		err := CheckEmptying(tc.current, tc.images, tc.allow)
		if (err != nil) != tc.refused {
			t.Errorf("%+v: %v", tc, err)
		}
		if err != nil && !strings.Contains(err.Error(), "ConfigMap ns/os-images-info lists 1 images: not replaced") {
			t.Errorf("message: %v", err)
		}
	}
}
