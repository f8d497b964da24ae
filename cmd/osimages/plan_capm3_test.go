package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// checkPlanOfOCIDelivery runs `osimages plan` against the apiserver k, whose
// namespace ns holds Metal3MachineTemplates of image URLs (render applied
// them), once the cluster values of ns ask for image_delivery: oci: with a
// CAPM3 that refuses oci:// templates, plan says the cluster would fail,
// naming the level, the release needed and the fix, before anyone renders;
// with one that takes them, the switch is a roll, not a failure.
func checkPlanOfOCIDelivery(t *testing.T, k *testenv.Kube, ns string, acceptsOCI bool, catalog, served string) {
	t.Helper()
	ctx := context.Background()
	const label = "osimages-test/plan-capm3"
	nsObj, err := k.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels = map[string]string{label: "yes"}
	if _, err := k.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// One document: the level's default delivery, which md0 inherits.
	ociValues := strings.Replace(clusterDoc, "capm3:\n", "capm3:\n  image_delivery: oci\n", 1)
	for name, cm := range map[string]*corev1.ConfigMap{
		osimage.InfoConfigMapName: {Data: map[string]string{osimage.ValuesKey: catalog}},
		"served":                  {Data: map[string]string{osimage.ValuesKey: served}},
		"cluster":                 {Data: map[string]string{osimage.ValuesKey: ociValues}},
	} {
		cm.Name, cm.Namespace = name, ns
		if name == "cluster" {
			cm.Labels = map[string]string{fleet.ClusterValuesLabel: ""}
		}
		if _, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The proposed management values serve both images: nothing of the
	// served set changes, only the CAPM3 in place can fail the cluster.
	mgmt := writeFile(t, "mgmt.yaml", `name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu, hardened: "false"}}
os_image_server_additional_selectors:
  hardened: {os: ubuntu, hardened: "true"}
`)
	r := run(t, "plan", "-f", mgmt, "--os-images", writeFile(t, "proposed.yaml", catalog), "--kubeconfig", k.Kubeconfig,
		"--served-configmap", ns+"/served", "--namespace-selector", label+"=yes")
	if !acceptsOCI {
		for _, want := range []string{
			"would fail: ConfigMap " + ns + "/cluster .control_plane.capm3.image_delivery: oci: the installed Cluster API Provider Metal3 requires spec.template.spec.image.checksum",
			"(CAPM3 before v1.14.0)", "upgrade CAPM3 to v1.14.0 or later, or set image_delivery: http",
			"ConfigMap " + ns + "/cluster .machine_deployments.md0.capm3.image_delivery: oci: ",
		} {
			if r.code != 1 || !strings.Contains(r.stdout, want) {
				t.Fatalf("plan: exit %d, want 1 and %q in\n%s%s", r.code, want, r.stdout, r.stderr)
			}
		}
		return
	}
	if r.code != 0 || strings.Contains(r.stdout, "would fail") || strings.Contains(r.stdout, "cannot tell") || !strings.Contains(r.stdout, "rolls nodes: ") {
		t.Fatalf("plan: exit %d, want 0 and the switch to oci:// as a roll, no failure\n%s%s", r.code, r.stdout, r.stderr)
	}
}
