package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/opencontainers/go-digest"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

var catalog = osimage.Catalog{
	"plain":    {"sha256": sum("plain"), "filename": "plain.raw", "image-format": "raw", "os": "ubuntu", "hardened": "false", "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1", "oci-image-registry-key": "sylva"},
	"hardened": {"sha256": sum("hardened"), "filename": "hardened.raw", "image-format": "raw", "os": "ubuntu", "hardened": "true", "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1", "oci-image-registry-key": "sylva"},
}

func clusterValues(t *testing.T, doc string) values.Values {
	t.Helper()
	v, err := values.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const cluster = `name: wc1
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu, hardened: false}}
machine_deployments:
  md0: {capm3: {os_image_selector: {hardened: true}}}
`

func template(ns, name, url, checksum string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3MachineTemplate",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"image": map[string]any{
			"url": url, "checksum": checksum, "checksumType": "sha256", "format": "raw"}}}},
	}}
	return u
}

func TestNeedsFromTemplatesAndValues(t *testing.T) {
	old := sum("old")
	in := Inputs{
		Namespace: "wc1",
		Clusters:  []ClusterValues{{Source: "ConfigMap wc1/values", Values: clusterValues(t, cluster)}},
		Catalog:   catalog,
		Objects: []*unstructured.Unstructured{
			template("wc1", "wc1-cp-old", "https://h/images/"+old+"/old.raw", old),
			// Given by hand with an md5 and a foreign URL: not osimages'.
			template("wc1", "wc1-md-manual", "https://elsewhere/x.raw", strings.Repeat("a", 32)),
			// An md5 checksum but an osimages URL: the URL tells.
			template("wc1", "wc1-md-url", "https://h/images/"+sum("plain")+"/plain.raw", ""),
		},
	}
	needs, err := Needs(in)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, n := range needs {
		got[string(n.SHA256)] = append(got[string(n.SHA256)], n.By)
	}
	if len(got) != 3 {
		t.Fatalf("want 3 images needed (old, plain, hardened), got %v", got)
	}
	if by := got[old]; len(by) != 1 || by[0] != "Metal3MachineTemplate wc1/wc1-cp-old" {
		t.Errorf("old image needed by %v", by)
	}
	if by := strings.Join(got[sum("hardened")], ","); by != "ConfigMap wc1/values .machine_deployments.md0.capm3" {
		t.Errorf("hardened needed by %q", by)
	}
	if by := got[sum("plain")]; len(by) != 2 {
		t.Errorf("plain is needed by a template and by the control plane, got %v", by)
	}
}

func TestNeedsReportsWhatCannotBePicked(t *testing.T) {
	in := Inputs{Namespace: "wc1", Clusters: []ClusterValues{{Source: "ConfigMap wc1/values", Values: clusterValues(t, cluster)}}}
	_, err := Needs(in)
	if err == nil || !strings.Contains(err.Error(), "no os-images-info") {
		t.Fatalf("a cluster without catalog must be reported, got %v", err)
	}
	in.Catalog = osimage.Catalog{"plain": catalog["plain"]}
	needs, err := Needs(in)
	if err == nil || !strings.Contains(err.Error(), ".machine_deployments.md0.capm3: no OS image could be found matching selectors") {
		t.Fatalf("want md0's pick error with the contract's words, got %v", err)
	}
	if len(needs) != 1 || needs[0].SHA256 != osimage.SHA256(sum("plain")) {
		t.Errorf("the levels that can pick still count: %v", needs)
	}
}

func TestCheckStates(t *testing.T) {
	needs := []Need{
		{SHA256: osimage.SHA256(sum("a")), ImageKey: "a", By: "x"},
		{SHA256: osimage.SHA256(sum("b")), ImageKey: "b", By: "y"},
		{SHA256: osimage.SHA256(sum("c")), ImageKey: "c", By: "z"},
		{SHA256: osimage.SHA256(sum("c")), ImageKey: "c", By: "w"},
	}
	served := osimage.ServedSet{osimage.SHA256(sum("a")): {Available: true, ImageKey: "m"}, osimage.SHA256(sum("b")): {Available: false, ImageKey: "m2"}}
	r := Check("wc1", "copy", needs, osimage.ServedOutput{Set: served}, true, errors.New("broken level"))
	states := map[string]osimage.ImageState{}
	for _, img := range r.Images {
		states[img.ImageKey] = img.State
	}
	if states["a"] != osimage.StateServed || states["b"] != osimage.StateNotAvailable || states["c"] != osimage.StateNotServed {
		t.Fatalf("states: %v", states)
	}
	probs := r.Problems()
	if len(probs) != 2 {
		t.Fatalf("problems: %+v", probs)
	}
	for _, p := range probs {
		switch p.ImageKey {
		case "b":
			if !strings.Contains(p.Message, "not available yet") {
				t.Errorf("b: %s", p.Message)
			}
		case "c":
			if p.Message != "image "+sum("c")+"/c is currently not served by mgmt cluster os-image-server" {
				t.Errorf("c: %s", p.Message)
			}
			if strings.Join(p.NeededBy, ",") != "w,z" {
				t.Errorf("c needed by %v", p.NeededBy)
			}
		}
	}
	if len(r.Errors) != 1 || r.Count(osimage.StateNotServed) != 1 {
		t.Errorf("report: %+v", r)
	}
	doc, err := osimage.MarshalCheckReport(r)
	if err != nil {
		t.Fatal(err)
	}
	back, err := osimage.ParseCheckReport(string(doc))
	if err != nil || len(back.Images) != 3 || back.Images[0].SHA256 != r.Images[0].SHA256 {
		t.Errorf("status round trip: %+v, %v", back, err)
	}
}

func TestPlanVerdicts(t *testing.T) {
	a, b, c := sum("a"), sum("b"), sum("c")
	current := osimage.ServedSet{osimage.SHA256(a): {Available: true}, osimage.SHA256(b): {Available: true}}
	proposed := osimage.ServedOutput{Set: osimage.ServedSet{osimage.SHA256(a): {Available: false}, osimage.SHA256(c): {}}}
	cases := []struct {
		name  string
		needs []string
		err   error
		want  Verdict
	}{
		{"still served (even not yet available)", []string{a}, nil, Unchanged},
		{"dropped", []string{a, b}, nil, WouldFail},
		{"newly served", []string{a, c}, nil, NewlyServed},
		{"never served", []string{sum("d")}, nil, WouldFail},
		{"inputs broken", []string{a}, errors.New("x"), CannotTell},
		{"dropped beats broken inputs", []string{b}, errors.New("x"), WouldFail},
		{"nothing needed", nil, nil, Unchanged},
	}
	for _, tc := range cases {
		var needs []Need
		for _, s := range tc.needs {
			needs = append(needs, Need{SHA256: osimage.SHA256(s), ImageKey: "k", By: "t"})
		}
		p := Plan("ns", needs, current, proposed, tc.err)
		if p.Verdict != tc.want {
			t.Errorf("%s: verdict %q, want %q (%+v)", tc.name, p.Verdict, tc.want, p)
		}
	}
	p := Plan("ns", []Need{{SHA256: osimage.SHA256(b), ImageKey: "k", By: "t"}}, current, proposed, nil)
	if p.Lines[0].Detail != b+"/k no longer served" {
		t.Errorf("detail: %q", p.Lines[0].Detail)
	}
}

func TestGather(t *testing.T) {
	info, err := osimage.MarshalInfo(catalog)
	if err != nil {
		t.Fatal(err)
	}
	cm := func(name string, labels map[string]string, doc string) corev1.ConfigMap {
		return corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "wc1", Labels: labels}, Data: map[string]string{"values.yaml": doc}}
	}
	cms := []corev1.ConfigMap{
		cm("z-cluster", map[string]string{ClusterValuesLabel: ""}, cluster),
		cm("os-images-info", nil, string(info)),
		cm("copy", nil, "capm3_os_image_server_images:\n  "+sum("plain")+": {available: true, image_key: k}\n"),
		cm("broken", map[string]string{ClusterValuesLabel: ""}, "a: [\n"),
		cm("unrelated", nil, "whatever: 1\n"),
	}
	g := Gather("wc1", "copy", cms, nil)
	if len(g.Clusters) != 1 || g.Clusters[0].Source != "ConfigMap wc1/z-cluster" {
		t.Errorf("clusters: %+v", g.Clusters)
	}
	if len(g.Catalog) != 2 || !g.ServedFound || !g.Served.Set[osimage.SHA256(sum("plain"))].Available {
		t.Errorf("catalog %v, served %v %v", g.Catalog, g.Served, g.ServedFound)
	}
	if g.Unreadable == nil || !strings.Contains(g.Unreadable.Error(), "ConfigMap wc1/broken") {
		t.Errorf("the unparsable ConfigMap must be named: %v", g.Unreadable)
	}
	needs, err := Needs(g.Inputs)
	if err == nil || len(needs) != 2 {
		t.Errorf("needs %v, err %v: the readable cluster still counts, the broken one is reported", needs, err)
	}
}

// The check picks from (A) as render does (osimage.MergeA): the values' own
// os_images merge over os-images-info image by image and field by field;
// they do not replace it.
func TestNeedsCatalogA(t *testing.T) {
	// The values pin one field of the hardened image and add nothing else:
	// the plain image still comes from os-images-info.
	doc := cluster + "os_images:\n  hardened: {sha256: " + sum("pinned") + "}\n"
	needs, err := Needs(Inputs{
		Namespace: "wc1",
		Clusters:  []ClusterValues{{Source: "ConfigMap wc1/values", Values: clusterValues(t, doc)}},
		Catalog:   catalog,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, n := range needs {
		got[n.By] = string(n.SHA256) + "/" + n.ImageKey
	}
	if want := sum("plain") + "/plain"; got["ConfigMap wc1/values .control_plane.capm3"] != want {
		t.Errorf("control plane needs %q, want %q (from os-images-info)", got["ConfigMap wc1/values .control_plane.capm3"], want)
	}
	if want := sum("pinned") + "/hardened"; got["ConfigMap wc1/values .machine_deployments.md0.capm3"] != want {
		t.Errorf("md0 needs %q, want %q (the values' field over os-images-info's image)", got["ConfigMap wc1/values .machine_deployments.md0.capm3"], want)
	}
}

// A Metal3 object that takes its image by oci:// needs that image, and
// the manifest its URL names: one the server does not answer (a catalog
// that gave another size) is not served, said with the URL that fails.
func TestCheckOCIReferences(t *testing.T) {
	sha := osimage.SHA256(sum("plain"))
	good, bad := "sha256:"+sum("good manifest"), "sha256:"+sum("bad manifest")
	obj := func(name, manifest string) *unstructured.Unstructured {
		u := template("wc1", name, "oci://192.0.2.10/images/"+string(sha)+"@"+manifest, "")
		unstructured.RemoveNestedField(u.Object, "spec", "template", "spec", "image", "checksum")
		unstructured.RemoveNestedField(u.Object, "spec", "template", "spec", "image", "checksumType")
		return u
	}
	needs, err := Needs(Inputs{Namespace: "wc1", Catalog: catalog, Objects: []*unstructured.Unstructured{obj("t-good", good)}})
	if err != nil || len(needs) != 1 || needs[0].SHA256 != sha || needs[0].Manifest.String() != good || needs[0].Filename != "" || needs[0].Delivery != "oci-digest" {
		t.Fatalf("needs of an oci:// template: %+v %v", needs, err)
	}
	// The form render writes now, the disk type's tag: the image, no
	// manifest to check.
	tagged := template("wc1", "t-tag", "oci://192.0.2.10/images/"+string(sha)+":raw", "")
	unstructured.RemoveNestedField(tagged.Object, "spec", "template", "spec", "image", "checksum")
	if n, err := Needs(Inputs{Namespace: "wc1", Catalog: catalog, Objects: []*unstructured.Unstructured{tagged}}); err != nil || len(n) != 1 || n[0].SHA256 != sha || n[0].Manifest != "" || n[0].Delivery != "oci" {
		t.Fatalf("needs of an oci:// template by the disk type's tag: %+v %v", n, err)
	}
	served := osimage.ServedOutput{Set: osimage.ServedSet{sha: {Available: true, ImageKey: "m"}},
		OCI: osimage.ServedOCI{sha: {Repository: osimage.OCIRepository(sha), Manifest: digest.Digest(good)}}}
	if r := Check("wc1", "copy", needs, served, true, nil); r.Images[0].State != osimage.StateServed {
		t.Errorf("the manifest served: %+v", r.Images[0])
	}
	needs, _ = Needs(Inputs{Namespace: "wc1", Catalog: catalog, Objects: []*unstructured.Unstructured{obj("t-good", good), obj("t-bad", bad)}})
	r := Check("wc1", "copy", needs, served, true, nil)
	if img := r.Images[0]; img.State != osimage.StateNotServed || !strings.Contains(img.Message, "under manifest "+good+", not "+bad) || !strings.Contains(img.Message, "images/"+string(sha)+"@"+bad+" would answer 404") {
		t.Errorf("another manifest: %+v", img)
	}
	// A server that publishes no OCI references (Sylva's, an older one)
	// is compared by sha256 only.
	if r := Check("wc1", "copy", needs, osimage.ServedOutput{Set: served.Set}, true, nil); r.Images[0].State != osimage.StateServed {
		t.Errorf("without OCI references: %+v", r.Images[0])
	}
}
