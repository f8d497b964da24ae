package catalog

import (
	"errors"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/values"
)

func mustParse(t *testing.T, doc string) values.Values {
	t.Helper()
	v, err := values.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const baseValues = `
sylva_base_oci_registry: oci://registry.example.org/sylva-projects
sylva_diskimagebuilder_version: 0.7.6
os_images_oci_registries:
  sylva:
    url: '{{ .Values.sylva_base_oci_registry }}/sylva-elements/diskimage-builder'
    tag: '{{ .Values.sylva_diskimagebuilder_version }}'
  off:
    url: oci://other.example.org/images
    tag: "1.0"
    enabled: false
sylva_diskimagebuilder_images:
  ubuntu-noble-plain-rke2-1-32: {os_images_oci_registry: sylva}
  ubuntu-noble-hardened-rke2-1-32: {os_images_oci_registry: sylva}
  dropped-with-registry: {os_images_oci_registry: off}
  dropped-by-itself: {os_images_oci_registry: sylva, enabled: false}
os_images:
  ubuntu-noble-hardened-rke2-1-32:
    image-format: qcow2
  my-image:
    uri: https://files.example.org/my-image.raw
    sha256: 0f3a6f0f7c4c3f4e6b5f0e0d7a1a4c9e8b7d6c5b4a39281706f5e4d3c2b1a090
    image-format: raw
    size: "1024"
`

func TestPlanFromValues(t *testing.T) {
	plan, err := PlanFromValues(mustParse(t, baseValues), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Source{}
	for _, s := range plan.Sources {
		got[s.Key] = s
	}
	if len(got) != 3 {
		t.Fatalf("want 3 sources (disabled registry and image dropped), got %v", plan.Sources)
	}
	plain := got["ubuntu-noble-plain-rke2-1-32"]
	if want := "oci://registry.example.org/sylva-projects/sylva-elements/diskimage-builder/ubuntu-noble-plain-rke2-1-32:0.7.6"; plain.URI != want {
		t.Errorf("DIB URI = %q, want %q", plain.URI, want)
	}
	if plain.RegistryKey != "sylva" {
		t.Errorf("registry key = %q", plain.RegistryKey)
	}
	hardened := got["ubuntu-noble-hardened-rke2-1-32"]
	if hardened.RegistryKey != "sylva" || hardened.Declared.Get("image-format") != "qcow2" || !hardened.IsOCI() {
		t.Errorf("a DIB image also declared by hand keeps its registry and gets the declared fields: %+v", hardened)
	}
	mine := got["my-image"]
	if mine.IsOCI() || mine.RegistryKey != "" || mine.Declared.Get("size") != "1024" {
		t.Errorf("hand-declared HTTP image: %+v", mine)
	}
	if plan.Sources[0].Key > plan.Sources[1].Key {
		t.Errorf("sources are not sorted: %v", plan.Sources)
	}
}

func TestPlanFilter(t *testing.T) {
	for _, tc := range []struct {
		filter string
		want   []string
	}{
		{"ubuntu-noble-plain-rke2-1-32", []string{"ubuntu-noble-plain-rke2-1-32"}},
		{"ubuntu", nil}, // anchored: a prefix is not a match
		{"ubuntu-.*", []string{"ubuntu-noble-hardened-rke2-1-32", "ubuntu-noble-plain-rke2-1-32"}},
		{"sylva", []string{"ubuntu-noble-hardened-rke2-1-32", "ubuntu-noble-plain-rke2-1-32"}}, // registry key
		{"my-image|.*plain.*", []string{"my-image", "ubuntu-noble-plain-rke2-1-32"}},
	} {
		re, err := CompileFilter(tc.filter)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := PlanFromValues(mustParse(t, baseValues), re)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, s := range plan.Sources {
			keys = append(keys, s.Key)
		}
		if strings.Join(keys, ",") != strings.Join(tc.want, ",") {
			t.Errorf("--filter %q kept %v, want %v", tc.filter, keys, tc.want)
		}
	}
	if _, err := CompileFilter("("); err == nil || !strings.Contains(err.Error(), `"(" is not a regular expression`) {
		t.Errorf("bad filter: %v", err)
	}
}

func TestPlanInputErrors(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"bad os_images key", `
os_images:
  Bad_Key: {uri: "https://x/y.raw"}`, "os_images.Bad_Key: key must match ^[a-z0-9][a-z0-9-]{1,50}[a-z0-9]$"},
		{"bad DIB key", `
os_images_oci_registries: {sylva: {url: oci://r/x, tag: "1"}}
sylva_diskimagebuilder_images:
  x: {os_images_oci_registry: sylva}`, "sylva_diskimagebuilder_images.x: key must match"},
		{"undefined registry", `
os_images_oci_registries: {sylva: {url: oci://r/x, tag: "1"}}
sylva_diskimagebuilder_images:
  ubuntu-noble: {os_images_oci_registry: nowhere}`, "sylva_diskimagebuilder_images.ubuntu-noble.os_images_oci_registry ('nowhere') is not defined in os_images_oci_registries"},
		{"registry url without oci scheme", `
os_images_oci_registries: {sylva: {url: https://r/x, tag: "1"}}`, `os_images_oci_registries.sylva.url: "https://r/x" must start with oci://`},
		{"registry tag missing", `
os_images_oci_registries: {sylva: {url: oci://r/x}}`, "os_images_oci_registries.sylva.tag: missing"},
		{"unresolvable reference", `
os_images_oci_registries: {sylva: {url: '{{ .Values.nope }}/x', tag: "1"}}`, "os_images_oci_registries.sylva.url: cannot resolve"},
		{"self reference", `
a: '{{ .Values.a }}'
os_images_oci_registries: {sylva: {url: '{{ .Values.a }}', tag: "1"}}`, "nest deeper than"},
		{"os_images without uri", `
os_images:
  my-image: {sha256: 0f3a6f0f7c4c3f4e6b5f0e0d7a1a4c9e8b7d6c5b4a39281706f5e4d3c2b1a090}`, "os_images.my-image.uri: missing"},
		{"os_images bad sha256", `
os_images:
  my-image: {uri: "https://x/y.raw", sha256: ABC}`, `os_images.my-image.sha256: sha256 "ABC" is not 64 lowercase hex digits`},
		{"os_images bad scheme", `
os_images:
  my-image: {uri: "ftp://x/y.raw"}`, `os_images.my-image.uri: "ftp://x/y.raw" must start with oci://, http:// or https://`},
		{"os_images entry not a map", `
os_images:
  my-image: just-a-string`, "os_images.my-image: must be a map"},
		{"os_images contract field not a string", `
os_images:
  my-image: {uri: "https://x/y.raw", filename: [a, b]}`, "os_images.my-image.filename: must be a string, got a list"},
		{"os_images field that is a number", `
os_images:
  my-image: {uri: "https://x/y.raw", os-release: 15.10}`, `os_images.my-image.os-release: is a YAML number (the number 15.1), whose text is lost once read`},
		{"insecure not a boolean", `
oci_registry_insecure: maybe`, "oci_registry_insecure: must be true or false"},
		{"registries not a map", `
os_images_oci_registries: [a]`, "os_images_oci_registries: must be a map, got a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := PlanFromValues(mustParse(t, tc.values), nil)
			var inputErr *InputError
			if !errors.As(err, &inputErr) {
				t.Fatalf("want an InputError, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestPlanReportsEveryFault(t *testing.T) {
	_, err := PlanFromValues(mustParse(t, `
os_images_oci_registries: {sylva: {url: oci://r/x, tag: "1"}}
sylva_diskimagebuilder_images:
  Bad1: {os_images_oci_registry: sylva}
  good-one: {os_images_oci_registry: missing}
os_images:
  Bad2: {uri: "https://x"}`), nil)
	var inputErr *InputError
	if !errors.As(err, &inputErr) || len(inputErr.Errs) != 3 {
		t.Fatalf("want 3 faults in one report, got %v", err)
	}
}

func TestInputsHash(t *testing.T) {
	a, _ := PlanFromValues(mustParse(t, baseValues), nil)
	b, _ := PlanFromValues(mustParse(t, baseValues), nil)
	if a.InputsHash() != b.InputsHash() {
		t.Error("equal inputs give different hashes")
	}
	c, _ := PlanFromValues(mustParse(t, strings.Replace(baseValues, "0.7.6", "0.7.7", 1)), nil)
	if a.InputsHash() == c.InputsHash() {
		t.Error("a new diskimage-builder version does not change the hash")
	}
	d, _ := PlanFromValues(mustParse(t, strings.Replace(baseValues, `size: "1024"`, `size: "2048"`, 1)), nil)
	if a.InputsHash() == d.InputsHash() {
		t.Error("a changed hand-declared field does not change the hash")
	}
}
