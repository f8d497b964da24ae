package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// osImagesDoc is a cluster's own catalog (A) with two images.
var osImagesDoc = fmt.Sprintf(`os_images:
  ubuntu-plain:
    sha256: %s
    filename: ubuntu-plain.raw
    image-format: raw
    os: ubuntu
    hardened: "false"
    k8s-flavor: rke2
    k8s-version: 1.32.5+rke2r1
    oci-image-registry-key: sylva
  ubuntu-hardened:
    sha256: %s
    filename: ubuntu-hardened.qcow2
    image-format: qcow2
    os: ubuntu
    hardened: "true"
    k8s-flavor: rke2
    k8s-version: 1.32.5+rke2r1
    oci-image-registry-key: sylva
`, sum("plain"), sum("hardened"))

const clusterDoc = `name: wc1
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {os: ubuntu, hardened: false}
  image_provisioning_host: 192.0.2.10
machine_deployments:
  md0:
    capm3:
      os_image_selector: {hardened: true}
      nodeReuse: true
      automatedCleaningMode: disabled
      hostSelector: {matchLabels: {pool: md0}}
`

func servedDoc(available bool, shas ...string) string {
	var b strings.Builder
	b.WriteString("capm3_os_image_server_images:\n")
	for i, s := range shas {
		fmt.Fprintf(&b, "  %s: {available: %v, image_key: mgmt-key-%d}\n", s, available, i)
	}
	return b.String()
}

func TestRenderFromValues(t *testing.T) {
	v := writeFile(t, "cluster.yaml", clusterDoc+osImagesDoc+servedDoc(true, sum("plain"), sum("hardened")))
	r := run(t, "render", "-f", v)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	docs := strings.Split(strings.TrimPrefix(r.stdout, "---\n"), "---\n")
	if len(docs) != 2 {
		t.Fatalf("want 2 templates, got %d:\n%s", len(docs), r.stdout)
	}
	var md0 struct {
		Metadata struct{ Name string }
		Spec     struct {
			NodeReuse bool `json:"nodeReuse"`
			Template  struct {
				Spec struct {
					Image map[string]string
				}
			}
		}
	}
	if err := yaml.Unmarshal([]byte(docs[1]), &md0); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(md0.Metadata.Name, "wc1-md0-") || !md0.Spec.NodeReuse {
		t.Errorf("md0 template: %+v", md0)
	}
	wantURL := "https://192.0.2.10/images/" + sum("hardened") + "/ubuntu-hardened.qcow2"
	if img := md0.Spec.Template.Spec.Image; img["url"] != wantURL || img["checksum"] != sum("hardened") || img["checksumType"] != "sha256" || img["format"] != "qcow2" {
		t.Errorf("md0 image block: %v", img)
	}

	// (B) renamed and grown on the management side: byte-identical output.
	v2 := writeFile(t, "cluster.yaml", clusterDoc+osImagesDoc+servedDoc(true, sum("other"), sum("hardened"), sum("plain")))
	if r2 := run(t, "render", "-f", v2); r2.stdout != r.stdout {
		t.Errorf("a management-side change of (B) changed the output:\n%s\nvs\n%s", r.stdout, r2.stdout)
	}
}

func TestRenderFailures(t *testing.T) {
	for _, tc := range []struct {
		name, served string
		want         []string
	}{
		{"not served", servedDoc(true, sum("plain")), []string{
			".machine_deployments.md0.capm3", "image " + sum("hardened") + "/ubuntu-hardened is currently not served by mgmt cluster os-image-server"}},
		{"still downloading", servedDoc(false, sum("plain"), sum("hardened")), []string{"still being prepared"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "render", "-f", writeFile(t, "c.yaml", clusterDoc+osImagesDoc+tc.served))
			if r.code != 1 || r.stdout != "" {
				t.Fatalf("want exit 1 and nothing printed, got %d, %q", r.code, r.stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
	// Every failing level is reported in one run.
	twoBad := strings.Replace(clusterDoc, "{hardened: true}", "{hardened: maybe}", 1) + "control_plane: {capm3: {image_key: nope, os_image_selector: null}}\n" + osImagesDoc + servedDoc(true)
	r := run(t, "render", "-f", writeFile(t, "c.yaml", twoBad))
	for _, w := range []string{".control_plane.capm3: nothing in os_images for image_key nope", ".machine_deployments.md0.capm3: no OS image could be found matching selectors"} {
		if r.code != 1 || !strings.Contains(r.stderr, w) {
			t.Errorf("exit %d, stderr lacks %q:\n%s", r.code, w, r.stderr)
		}
	}
}

// A malformed sha256 in the catalog is wrong values: exit 2 (README), with
// the input named and how to fix it, even beside a level whose image is
// merely not served; a pick or the served check failing alone exits 1.
func TestRenderMalformedSHA256IsTheInputs(t *testing.T) {
	for _, tc := range []struct{ name, sha, want string }{
		{"not hex", sum("plain")[:63] + "Z", `sha256 "` + sum("plain")[:63] + `Z" is not 64 lowercase hex digits`},
		{"uppercase", strings.ToUpper(sum("plain")), `sha256 "` + strings.ToUpper(sum("plain")) + `" is not 64 lowercase hex digits: write it in lowercase`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(osImagesDoc, "sha256: "+sum("plain"), "sha256: "+tc.sha, 1)
			// md0's image is not served: that alone would exit 1.
			r := run(t, "render", "-f", writeFile(t, "c.yaml", clusterDoc+doc+servedDoc(true, sum("plain"))))
			if r.code != 2 || r.stdout != "" {
				t.Fatalf("want exit 2 and nothing printed, got %d, %q\n%s", r.code, r.stdout, r.stderr)
			}
			for _, w := range []string{
				".control_plane.capm3: os_images.ubuntu-plain: " + tc.want,
				".control_plane.capm3: os_images.ubuntu-plain comes from the values' os_images: correct the image's record there (its sha256 is the image file's, 64 lowercase hexadecimal digits as sha256sum prints them",
				".machine_deployments.md0.capm3: image " + sum("hardened") + "/ubuntu-hardened is currently not served",
			} {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

func TestSelect(t *testing.T) {
	cat := writeFile(t, "os-images.yaml", osImagesDoc)
	r := run(t, "select", "--os-images", cat, "--selector", "os=ubuntu", "--selector", "hardened=true")
	if r.code != 0 || !strings.Contains(r.stdout, "ubuntu-hardened") || !strings.Contains(r.stdout, sum("hardened")) || strings.Contains(r.stdout, "ubuntu-plain") {
		t.Errorf("one match: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, "select", "--os-images", cat, "--selector", "os=ubuntu")
	if r.code != 1 || !strings.Contains(r.stdout, "ubuntu-plain") || !strings.Contains(r.stdout, "ubuntu-hardened") ||
		!strings.Contains(r.stderr, "--selector: we need one OS image, but 2 were found matching selectors") {
		t.Errorf("two matches: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, "select", "--os-images", cat, "--selector", "colour=blue")
	if r.code != 2 || !strings.Contains(r.stderr, "OS selector key 'colour': this key is not among the supported base keys") {
		t.Errorf("unknown key: exit %d %s", r.code, r.stderr)
	}
	// A level of cluster values, finalized as render does; the catalog may
	// be given as the os-images-info ConfigMap itself.
	cm := writeFile(t, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: os-images-info}\ndata:\n  values.yaml: |\n"+indent(osImagesDoc, "    "))
	cluster := writeFile(t, "cluster.yaml", clusterDoc)
	r = run(t, "select", "--os-images", cm, "--cluster-values", cluster, "--level", ".machine_deployments.md0.capm3")
	if r.code != 0 || !strings.Contains(r.stdout, "picked: ubuntu-hardened") {
		t.Errorf("level md0: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	k8s131 := writeFile(t, "k8s131.yaml", "k8s_version: v1.31.0+rke2r1\n")
	r = run(t, "select", "--os-images", cm, "--cluster-values", cluster, "--cluster-values", k8s131, "--level", ".control_plane.capm3")
	if r.code != 1 || !strings.Contains(r.stderr, ".control_plane.capm3: no OS image could be found matching selectors") {
		t.Errorf("finalized with another k8s version: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

// TestRenderApply creates the templates in a real apiserver whose Metal3
// CRDs validate them, reading (A) and (B) from ConfigMaps.
func TestRenderApply(t *testing.T) {
	if testenv.Metal3CRDs() == "" {
		testenv.SharedDir(t) // ends the test, saying why
		testenv.Missing(t, "shared/ has no crds/metal3: the templates are not checked against the real Metal3 CRDs")
	}
	k := apiserver(t)
	ctx := context.Background()
	ns := "wc1"
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	putConfigMap := func(name, doc string) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string]string{osimage.ValuesKey: doc}}
		_, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			_, err = k.Client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	putConfigMap("os-images-info", osImagesDoc)
	putConfigMap("kyverno-cloned-os-image-server-images", servedDoc(true, sum("plain")))
	cluster := writeFile(t, "cluster.yaml", clusterDoc)
	dyn := dynamic.NewForConfigOrDie(k.Config)

	for _, version := range []string{"v1beta1", "v1beta2"} {
		gvr := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: version, Resource: "metal3machinetemplates"}
		args := []string{"render", "-f", cluster, "--apply", "--kubeconfig", k.Kubeconfig, "-n", ns, "--api-version", version,
			"--os-images-configmap", ns + "/os-images-info", "--served-configmap", ns + "/kyverno-cloned-os-image-server-images"}

		// md0's image is not served: nothing at all is written.
		putConfigMap("kyverno-cloned-os-image-server-images", servedDoc(true, sum("plain")))
		if r := run(t, args...); r.code != 1 || !strings.Contains(r.stderr, "is currently not served by mgmt cluster os-image-server") {
			t.Fatalf("%s: want the served check to fail, got exit %d: %s", version, r.code, r.stderr)
		}
		list, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before := len(list.Items)

		putConfigMap("kyverno-cloned-os-image-server-images", servedDoc(true, sum("plain"), sum("hardened")))
		r := run(t, args...)
		if r.code != 0 {
			t.Fatalf("%s: apply: exit %d: %s", version, r.code, r.stderr)
		}
		list, err = dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(list.Items) - before; got != 2 {
			t.Fatalf("%s: %d new templates, want 2", version, got)
		}
		for _, item := range list.Items {
			img, _, _ := unstructuredMap(item.Object, "spec", "template", "spec", "image")
			if img["checksum"] == nil || img["url"] == nil || img["checksumType"] != "sha256" {
				t.Errorf("%s %s: image block lost fields in the apiserver: %v", version, item.GetName(), img)
			}
			// The fixture CRD stores v1beta2 and has no conversion webhook
			// (CAPM3 patches one in when deployed), so envtest prunes the
			// v1beta1 "format" when it stores an object; the v1beta2 field
			// must survive.
			appliedNow := strings.Contains(r.stderr, ns+"/"+item.GetName()+" applied")
			if version == "v1beta2" && appliedNow && img["diskFormat"] == nil {
				t.Errorf("%s %s: diskFormat lost in the apiserver: %v", version, item.GetName(), img)
			}
		}
	}
}

func unstructuredMap(obj map[string]any, path ...string) (map[string]any, bool, error) {
	cur := obj
	for _, p := range path {
		next, ok := cur[p].(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = next
	}
	return cur, true, nil
}

// (A) is one rule everywhere (osimage.MergeA): the cluster's os-images-info
// (Flux's valuesFrom) with the values' own os_images merged on top, image
// by image and field by field. render, select and plan (hence the fleet
// check, which shares plan's code) must pick the same image from it.
func TestCatalogAIsOneRule(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	const ns, label = "catalog-a", "osimages-test/catalog-a"
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{label: "yes"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The values pin md0's image to another build: one field over the
	// image os-images-info describes, the rest of which still applies.
	values := clusterDoc + "os_images:\n  ubuntu-hardened: {sha256: " + sum("pinned") + ", filename: pinned.qcow2}\n"
	for name, cm := range map[string]*corev1.ConfigMap{
		"os-images-info": {Data: map[string]string{osimage.ValuesKey: osImagesDoc}},
		"served":         {Data: map[string]string{osimage.ValuesKey: servedDoc(true, sum("plain"), sum("pinned"))}},
		"cluster":        {Data: map[string]string{osimage.ValuesKey: values}},
	} {
		cm.Name, cm.Namespace = name, ns
		if name == "cluster" {
			cm.Labels = map[string]string{"osimages.sylva-project.org/cluster-values": ""}
		}
		if _, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cluster := writeFile(t, "cluster.yaml", values)

	r := run(t, "render", "-f", cluster, "--kubeconfig", k.Kubeconfig,
		"--os-images-configmap", ns+"/os-images-info", "--served-configmap", ns+"/served")
	if r.code != 0 {
		t.Fatalf("render: exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"/images/" + sum("plain") + "/ubuntu-plain.raw", "/images/" + sum("pinned") + "/pinned.qcow2", "format: qcow2"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("render: output lacks %q:\n%s", want, r.stdout)
		}
	}

	cm := writeFile(t, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: os-images-info}\ndata:\n  values.yaml: |\n"+indent(osImagesDoc, "    "))
	r = run(t, "select", "--os-images", cm, "--cluster-values", cluster, "--level", ".machine_deployments.md0.capm3")
	if r.code != 0 || !strings.Contains(r.stdout, "ubuntu-hardened  "+sum("pinned")) || !strings.Contains(r.stdout, "picked: ubuntu-hardened") {
		t.Errorf("select: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// The proposed management values serve only the plain image: plan
	// must see that the cluster needs the pinned build.
	mgmt := writeFile(t, "mgmt.yaml", "name: mgmt\nk8s_version: v1.32.5+rke2r1\ncapi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}\ncapm3: {os_image_selector: {os: ubuntu, hardened: \"false\"}}\n")
	r = run(t, "plan", "-f", mgmt, "--os-images", writeFile(t, "proposed.yaml", osImagesDoc), "--kubeconfig", k.Kubeconfig,
		"--served-configmap", ns+"/served", "--namespace-selector", label+"=yes")
	if r.code != 1 || !strings.Contains(r.stdout, "would fail: "+sum("pinned")+"/ubuntu-hardened no longer served") || strings.Contains(r.stdout, "cannot tell") {
		t.Errorf("plan: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
