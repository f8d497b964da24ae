package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// `osimages demo --once`, the README's first command, runs end to end
// with no cluster and no outside registry: it exits 0, prints the URL of
// every image it served, and its YAML stream holds os-images-info, the
// served set with those images available, and templates that boot from
// exactly those URLs.
func TestDemoOnce(t *testing.T) {
	r := run(t, "demo", "--once")
	if r.code != 0 {
		t.Fatalf("demo --once: exit %d\n%s", r.code, r.stderr)
	}
	served := map[string]string{} // sha256 -> URL printed
	for _, m := range regexp.MustCompile(`(?m)^demo: serving \S+: curl -O (http://127\.0\.0\.1:\d+/images/([0-9a-f]{64})/\S+)$`).FindAllStringSubmatch(r.stderr, -1) {
		served[m[2]] = m[1]
	}
	if len(served) == 0 {
		t.Fatalf("demo printed no served image URL:\n%s", r.stderr)
	}

	var configMaps []corev1.ConfigMap
	var templates []*unstructured.Unstructured
	for _, doc := range strings.Split(r.stdout, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---")
		if strings.TrimSpace(doc) == "" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("a document of the stream is not YAML: %v\n%s", err, doc)
		}
		switch u.GetKind() {
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
				t.Fatal(err)
			}
			configMaps = append(configMaps, cm)
		case metal3.KindMachineTemplate:
			templates = append(templates, u)
		default:
			t.Errorf("unexpected %s in the stream", u.GetKind())
		}
	}
	names := []string{}
	for _, cm := range configMaps {
		names = append(names, cm.Name)
	}
	if !slices.Equal(names, []string{osimage.InfoConfigMapName, "capm3-os-image-server-os-images"}) {
		t.Fatalf("ConfigMaps %v, want os-images-info then the served set", names)
	}
	catalog, err := osimage.ParseInfo([]byte(configMaps[0].Data["values.yaml"]))
	if err != nil || len(catalog) == 0 {
		t.Fatalf("os-images-info: %v, %d images", err, len(catalog))
	}
	set, err := osimage.ParseServed([]byte(configMaps[1].Data["values.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	for sha := range served {
		if !set[osimage.SHA256(sha)].Available {
			t.Errorf("printed as served, but not available in the served set: %s (%v)", sha, set)
		}
	}
	if len(set) != len(served) {
		t.Errorf("the served set has %d images, the demo printed %d", len(set), len(served))
	}

	if len(templates) == 0 {
		t.Fatal("no Metal3MachineTemplate rendered")
	}
	for _, u := range templates {
		img, ok := metal3.ImageOf(u)
		sha, _ := img.SHA256()
		if !ok || served[sha.String()] == "" || img.URL != served[sha.String()] {
			t.Errorf("template %s boots from %q, not an image the demo served %v", u.GetName(), img.URL, served)
		}
	}
}
