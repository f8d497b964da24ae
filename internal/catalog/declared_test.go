package catalog

import (
	"errors"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// Hand-declared fields are published as written: a null removes the
// field (an annotation of that name too), booleans and maps stay what they
// are, a number is refused with its values path since YAML decoding has
// already lost its text. The fields derived from a registry go when a
// declared uri takes the image out of it, unless they are declared too.
func TestDeclaredFields(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	publish(t, reg, 3)
	v := dibValues(t, reg, true, "img-00", "img-01", "img-02")
	v["os_images"] = map[string]any{
		// Served from a web server instead of the registry.
		"img-00": map[string]any{"uri": "https://files.example.org/img-00.raw", "sha256": strings.Repeat("a", 64)},
		// Likewise, but the registry key is declared by hand.
		"img-01": map[string]any{"uri": "https://files.example.org/img-01.raw", "sha256": strings.Repeat("b", 64), "oci-image-registry-key": "sylva"},
		// Still from the registry: a null drops an annotation; a boolean
		// and a map are published as they are.
		"img-02": map[string]any{"os-release": nil, "hardened": true, "extra": map[string]any{"a": "b"}},
	}
	cat, err := resolveValues(t, v, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{osimage.FieldRegistryKey, osimage.FieldManifestDigest, osimage.FieldOS} {
		if _, ok := cat["img-00"][f]; ok {
			t.Errorf("img-00 left the registry but keeps %s: %v", f, cat["img-00"])
		}
	}
	if cat["img-01"][osimage.FieldRegistryKey] != "sylva" {
		t.Errorf("img-01 declares its registry key by hand: %v", cat["img-01"])
	}
	img := cat["img-02"]
	if _, ok := img["os-release"]; ok {
		t.Errorf("a declared null must remove the field: %v", img)
	}
	if img["hardened"] != true || img["os"] != "ubuntu" || img[osimage.FieldRegistryKey] != "sylva" || img.Get(osimage.FieldManifestDigest) == "" {
		t.Errorf("img-02: %v", img)
	}
	doc, err := osimage.MarshalInfo(cat)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"    hardened: true\n", "    extra:\n      a: b\n"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("os-images-info lacks %q:\n%s", want, doc)
		}
	}
	if strings.Contains(string(doc), "os-release: \"\"") || strings.Contains(string(doc), "os-release: null") {
		t.Errorf("a removed field is published:\n%s", doc)
	}
}

func TestDeclaredNumbersAreRefused(t *testing.T) {
	_, err := PlanFromValues(mustParse(t, `
os_images:
  my-image:
    uri: https://files.example.org/my.raw
    os-release: 15.10
    size: 22000000000
`), nil)
	var inputErr *InputError
	if !errors.As(err, &inputErr) {
		t.Fatalf("want an InputError, got %v", err)
	}
	for _, want := range []string{
		`os_images.my-image.os-release: is a YAML number (the number 15.1), whose text is lost once read (15.10 reads as 15.1): quote it as written`,
		`os_images.my-image.size: is a YAML number (the number 22000000000)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	// A null entry declares nothing: it is not an image without a uri.
	plan, err := PlanFromValues(mustParse(t, "os_images:\n  gone-image: null\n"), nil)
	if err != nil || len(plan.Sources) != 0 {
		t.Errorf("a null entry: %v %v", plan.Sources, err)
	}
}

// A filename the image server would refuse is refused by the catalog too,
// whether annotated or declared: a newline would otherwise write a second,
// chosen line into the served .sha256sum file.
func TestCatalogRefusesBadIdentity(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	_, err := reg.Publish(t.Context(), devregistry.DiskImage{
		Repository: dibRepo + "img-00", Tag: "0.7.6", Content: devregistry.DiskContent(4<<10, 1),
		Fields: osimage.Image{"filename": "a.raw\n" + strings.Repeat("0", 64) + "  evil.raw"},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = resolveValues(t, dibValues(t, reg, true, "img-00"), oci.Options{})
	var report *ResolveError
	if !errors.As(err, &report) || !strings.Contains(report.Failures[0].Cause, "annotation sylvaproject.org/diskimage/filename: image filename") ||
		!strings.Contains(report.Failures[0].Cause, "control character") {
		t.Fatalf("want the image refused for its filename, got %v", err)
	}
	for _, tc := range []struct{ field, value, want string }{
		{"filename", "a/../b.raw", `os_images.my-image.filename: image filename "a/../b.raw" holds "/"`},
		{"filename", "..", `os_images.my-image.filename: image filename ".." starts with "."`},
		{"filename", "", "os_images.my-image.filename: image filename is empty"},
		{"filename", strings.Repeat("a", 256), "longer than 255 bytes"},
		{"sha256", strings.Repeat("A", 64), "os_images.my-image.sha256: sha256 \"" + strings.Repeat("A", 64) + "\" is not 64 lowercase hex digits: write it in lowercase"},
	} {
		v := mustParse(t, "os_images:\n  my-image: {uri: https://x/y.raw}\n")
		v["os_images"].(map[string]any)["my-image"].(map[string]any)[tc.field] = tc.value
		var inputErr *InputError
		if _, err := PlanFromValues(v, nil); !errors.As(err, &inputErr) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %q: %v, want %q", tc.field, tc.value, err, tc.want)
		}
	}
}
