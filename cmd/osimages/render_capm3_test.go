package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestRenderApplyHoldsToTheInstalledCAPM3: render --apply reads the
// Metal3MachineTemplate CRD of the cluster it writes to. CAPM3 v1.13.2's
// (its real CRDs, from the module cache) requires image.checksum: render
// refuses image_delivery: oci, naming the level and the release needed,
// and writes nothing, while image URLs still apply. The CAPM3 of shared/
// (its CRD is v1.14.0-rc.0's) takes the oci:// template. plan, asked
// before the switch, says the same of each (checkPlanOfOCIDelivery).
func TestRenderApplyHoldsToTheInstalledCAPM3(t *testing.T) {
	refusingCRDs, err := testenv.CAPM3CRDs(testenv.CAPM3RefusingOCI)
	if err != nil {
		testenv.Missing(t, "CAPM3 %s's CRDs: %v", testenv.CAPM3RefusingOCI, err)
	}
	if testenv.Metal3CRDs() == "" {
		testenv.Missing(t, "shared/crds/metal3 (a CAPM3 that accepts oci:// images) not found")
	}
	refusing, err := testenv.StartKube(refusingCRDs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = refusing.Stop() })

	sized := strings.ReplaceAll(osImagesDoc, "    oci-image-registry-key: sylva\n", "    oci-image-registry-key: sylva\n    size: \"1048576\"\n")
	values := writeFile(t, "cluster.yaml", clusterDoc+sized+servedDoc(true, sum("plain"), sum("hardened")))
	oci := writeFile(t, "oci.yaml", "capm3: {image_delivery: oci}\n")
	templates := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Resource: "metal3machinetemplates"}
	ctx := context.Background()
	urls := func(k *testenv.Kube, ns string) []string {
		t.Helper()
		list, err := dynamic.NewForConfigOrDie(k.Config).Resource(templates).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range list.Items {
			u, _, _ := unstructured.NestedString(o.Object, "spec", "template", "spec", "image", "url")
			out = append(out, u)
		}
		return out
	}
	for _, c := range []struct {
		name       string
		k          *testenv.Kube
		acceptsOCI bool
	}{
		{"CAPM3 " + testenv.CAPM3RefusingOCI, refusing, false},
		{"CAPM3 of shared/ (as v1.14.0-rc.0)", apiserver(t), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := "render-capm3-" + map[bool]string{false: "old", true: "new"}[c.acceptsOCI]
			if _, err := c.k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			apply := []string{"render", "-f", values, "--kubeconfig", c.k.Kubeconfig, "-n", ns, "--apply"}
			r := run(t, append(apply, "-f", oci)...)
			if !c.acceptsOCI {
				for _, want := range []string{".control_plane.capm3.image_delivery: oci: the installed Cluster API Provider Metal3 requires spec.template.spec.image.checksum", "(CAPM3 before v1.14.0)", "upgrade CAPM3 to v1.14.0 or later, or set image_delivery: http"} {
					if r.code != 1 || !strings.Contains(r.stderr, want) {
						t.Fatalf("oci delivery: exit %d, want 1 and %q in\n%s", r.code, want, r.stderr)
					}
				}
				if got := urls(c.k, ns); len(got) != 0 {
					t.Fatalf("templates written all the same: %v", got)
				}
			} else if r.code != 0 {
				t.Fatalf("oci delivery: exit %d\n%s", r.code, r.stderr)
			}
			if r := run(t, apply...); r.code != 0 {
				t.Fatalf("image URLs: exit %d\n%s", r.code, r.stderr)
			}
			var ociURLs int
			for _, u := range urls(c.k, ns) {
				if strings.HasPrefix(u, "oci://") {
					ociURLs++
				}
			}
			if want := map[bool]int{false: 0, true: 2}[c.acceptsOCI]; ociURLs != want {
				t.Fatalf("%d templates with an oci:// URL in the apiserver, want %d: %v", ociURLs, want, urls(c.k, ns))
			}
			checkPlanOfOCIDelivery(t, c.k, ns, c.acceptsOCI, sized, servedDoc(true, sum("plain"), sum("hardened")))
		})
	}
}
