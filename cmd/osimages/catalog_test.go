package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

const dibRepo = "sylva-projects/sylva-elements/diskimage-builder/"

// countingRegistry starts a registry that counts the requests it gets once
// armed, and publishes the named images at each tag.
func countingRegistry(t *testing.T, tags []string, names ...string) (*devregistry.Registry, *atomic.Int64, map[string]devregistry.Published) {
	t.Helper()
	var requests atomic.Int64
	var armed atomic.Bool
	reg := testenv.Registry(t, devregistry.Options{Middleware: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if armed.Load() {
				requests.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	}})
	published := map[string]devregistry.Published{}
	for i, name := range names {
		for j, tag := range tags {
			p, err := reg.Publish(context.Background(), devregistry.DiskImage{
				Repository: dibRepo + name, Tag: tag, Gzip: true,
				Content: devregistry.DiskContent(32<<10, uint64(100*i+j)),
				Fields:  osimage.Image{"os": "ubuntu", "k8s-version": "1.32.5+rke2r1", "commit-tag": tag},
			})
			if err != nil {
				t.Fatal(err)
			}
			published[name+":"+tag] = p
		}
	}
	armed.Store(true)
	return reg, &requests, published
}

func catalogValues(reg *devregistry.Registry, names ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sylva_base_oci_registry: oci://%s/sylva-projects\nsylva_diskimagebuilder_version: 0.7.6\noci_registry_insecure: true\n", reg.Host)
	b.WriteString("os_images_oci_registries:\n  sylva:\n    url: '{{ .Values.sylva_base_oci_registry }}/sylva-elements/diskimage-builder'\n    tag: '{{ .Values.sylva_diskimagebuilder_version }}'\n")
	b.WriteString("sylva_diskimagebuilder_images:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %s: {os_images_oci_registry: sylva}\n", n)
	}
	return b.String()
}

func parseConfigMap(t *testing.T, out string) (*corev1.ConfigMap, osimage.Catalog) {
	t.Helper()
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(out), &cm); err != nil {
		t.Fatalf("output is not a ConfigMap: %v\n%s", err, out)
	}
	cat, err := osimage.ParseInfo([]byte(cm.Data[osimage.ValuesKey]))
	if err != nil {
		t.Fatal(err)
	}
	return &cm, cat
}

func TestCatalogPrintsConfigMap(t *testing.T) {
	reg, _, published := countingRegistry(t, []string{"0.7.6", "0.7.7"}, "ubuntu-noble-plain-rke2-1-32", "ubuntu-noble-hardened-rke2-1-32")
	base := writeFile(t, "values.yaml", catalogValues(reg, "ubuntu-noble-plain-rke2-1-32", "ubuntu-noble-hardened-rke2-1-32"))
	// A later -f wins, and references resolve against the merged values.
	bump := writeFile(t, "bump.yaml", "sylva_diskimagebuilder_version: 0.7.7\n")

	r := run(t, "catalog", "-f", base, "-f", bump, "--namespace", "my-cluster")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	cm, cat := parseConfigMap(t, r.stdout)
	if cm.Name != "os-images-info" || cm.Namespace != "my-cluster" || cm.Kind != "ConfigMap" {
		t.Errorf("metadata: %+v %+v", cm.TypeMeta, cm.ObjectMeta)
	}
	if _, ok := cm.Labels["sylva.os-images-info"]; !ok {
		t.Errorf("label sylva.os-images-info missing: %v", cm.Labels)
	}
	if !strings.HasPrefix(cm.Annotations[catalog.InputsHashAnnotation], "sha256:") {
		t.Errorf("inputs hash annotation: %v", cm.Annotations)
	}
	for _, name := range []string{"ubuntu-noble-plain-rke2-1-32", "ubuntu-noble-hardened-rke2-1-32"} {
		want := published[name+":0.7.7"]
		got := cat[name]
		if got["sha256"] != want.Fields.Get("sha256") || got["commit-tag"] != "0.7.7" || got["uri"] != "oci://"+want.Ref {
			t.Errorf("%s: got %v, want the 0.7.7 artifact %v", name, got, want.Fields)
		}
	}
}

func TestCatalogInputErrors(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"bad key", "os_images:\n  Bad_Key: {uri: 'https://x/y'}\n", "os_images.Bad_Key: key must match ^[a-z0-9][a-z0-9-]{1,50}[a-z0-9]$"},
		{"undefined registry", "sylva_diskimagebuilder_images:\n  ubuntu-noble: {os_images_oci_registry: nope}\n",
			"sylva_diskimagebuilder_images.ubuntu-noble.os_images_oci_registry ('nope') is not defined in os_images_oci_registries"},
		{"not YAML", "os_images: [\n", "values file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "catalog", "-f", writeFile(t, "values.yaml", tc.values))
			if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("want exit 2, no output and %q; got exit %d, stdout %q, stderr %q", tc.want, r.code, r.stdout, r.stderr)
			}
		})
	}
	if r := run(t, "catalog", "-f", "/nonexistent/values.yaml"); r.code != 2 || !strings.Contains(r.stderr, "/nonexistent/values.yaml") {
		t.Errorf("missing file: exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, "catalog", "-f", writeFile(t, "v.yaml", ""), "--filter", "("); r.code != 2 || !strings.Contains(r.stderr, "--filter") {
		t.Errorf("bad filter: exit %d, %q", r.code, r.stderr)
	}
}

func TestCatalogFailuresPrintNothing(t *testing.T) {
	reg, _, _ := countingRegistry(t, []string{"0.7.6"}, "ubuntu-noble-plain-rke2-1-32")
	v := writeFile(t, "values.yaml", catalogValues(reg, "ubuntu-noble-plain-rke2-1-32", "missing-one", "missing-two"))
	r := run(t, "catalog", "-f", v)
	if r.code != 1 || r.stdout != "" {
		t.Fatalf("want exit 1 and no output, got %d, %q", r.code, r.stdout)
	}
	for _, want := range []string{"2 of 3 images could not be resolved", "missing-one (oci://" + reg.Host, "missing-two (oci://", "tag not found"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
}

func TestCatalogApply(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	ns := "catalog-apply"
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reg, requests, _ := countingRegistry(t, []string{"0.7.6"}, "ubuntu-noble-plain-rke2-1-32", "ubuntu-noble-hardened-rke2-1-32")
	v := writeFile(t, "values.yaml", catalogValues(reg, "ubuntu-noble-plain-rke2-1-32"))
	apply := func(extra ...string) result {
		return run(t, append([]string{"catalog", "-f", v, "--apply", "--kubeconfig", k.Kubeconfig, "-n", ns}, extra...)...)
	}
	get := func() *corev1.ConfigMap {
		cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, "os-images-info", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}

	if r := apply(); r.code != 0 || r.stdout != "" {
		t.Fatalf("apply: exit %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
	}
	first := get()
	cat, err := osimage.ParseInfo([]byte(first.Data["values.yaml"]))
	if err != nil || len(cat) != 1 {
		t.Fatalf("applied catalog: %v %v", cat, err)
	}
	if requests.Load() == 0 {
		t.Fatal("the first apply made no registry request")
	}

	// Unchanged inputs: no registry traffic, no write.
	before := requests.Load()
	r := apply()
	if r.code != 0 || !strings.Contains(r.stderr, "up to date") {
		t.Fatalf("reapply: exit %d, %s", r.code, r.stderr)
	}
	if got := requests.Load() - before; got != 0 {
		t.Errorf("reapply with unchanged inputs made %d registry requests", got)
	}
	if again := get(); again.ResourceVersion != first.ResourceVersion {
		t.Errorf("reapply wrote the ConfigMap: resourceVersion %s -> %s", first.ResourceVersion, again.ResourceVersion)
	}

	// --force resolves again.
	before = requests.Load()
	if r := apply("--force"); r.code != 0 || requests.Load() == before {
		t.Errorf("--force: exit %d, %d requests", r.code, requests.Load()-before)
	}

	// Changed inputs: the new content is written.
	v2 := writeFile(t, "values.yaml", catalogValues(reg, "ubuntu-noble-plain-rke2-1-32", "ubuntu-noble-hardened-rke2-1-32"))
	if r := run(t, "catalog", "-f", v2, "--apply", "--kubeconfig", k.Kubeconfig, "-n", ns); r.code != 0 {
		t.Fatalf("apply of changed inputs: exit %d, %s", r.code, r.stderr)
	}
	changed := get()
	cat, _ = osimage.ParseInfo([]byte(changed.Data["values.yaml"]))
	if len(cat) != 2 || changed.Annotations[catalog.InputsHashAnnotation] == first.Annotations[catalog.InputsHashAnnotation] {
		t.Errorf("changed inputs not written: %d images, annotations %v", len(cat), changed.Annotations)
	}

	// A failure applies nothing.
	v3 := writeFile(t, "values.yaml", catalogValues(reg, "ubuntu-noble-plain-rke2-1-32", "missing-one"))
	if r := run(t, "catalog", "-f", v3, "--apply", "--kubeconfig", k.Kubeconfig, "-n", ns); r.code != 1 {
		t.Fatalf("apply with a missing image: exit %d", r.code)
	}
	if after := get(); after.ResourceVersion != changed.ResourceVersion {
		t.Error("a failed catalog run wrote the ConfigMap")
	}
}
