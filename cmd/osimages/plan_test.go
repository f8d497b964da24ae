package main

import (
	"strings"
	"testing"
)

// TestPlanFromFiles runs plan with every input from files: no cluster, no
// registry (the proposed catalog is given).
func TestPlanFromFiles(t *testing.T) {
	// The proposed management values select only the plain image.
	mgmt := writeFile(t, "mgmt.yaml", `name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu, hardened: "false"}}
`)
	osImages := writeFile(t, "os-images.yaml", osImagesDoc)
	current := writeFile(t, "served.yaml", servedDoc(true, sum("plain"), sum("hardened")))
	// wc1 uses both images (md0 is hardened); wc2 only the plain one.
	wc1 := writeFile(t, "wc1.yaml", clusterDoc+osImagesDoc)
	wc2 := writeFile(t, "wc2.yaml", strings.Replace(clusterDoc, "name: wc1", "name: wc2", 1)+"machine_deployments: null\n"+osImagesDoc)

	r := run(t, "plan", "-f", mgmt, "--os-images", osImages, "--served", current, "--cluster", "wc1="+wc1, "--cluster", "wc2="+wc2)
	if r.code != 1 {
		t.Fatalf("want exit 1 (wc1 would fail), got %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAMESPACE") {
		t.Fatalf("output:\n%s", r.stdout)
	}
	if f := strings.Fields(lines[1]); f[0] != "wc1" || !strings.Contains(lines[1], "would fail: "+sum("hardened")+"/ubuntu-hardened no longer served (needed by "+wc1+" .machine_deployments.md0.capm3)") {
		t.Errorf("wc1: %q", lines[1])
	}
	if f := strings.Fields(lines[2]); f[0] != "wc2" || f[1] != "unchanged" {
		t.Errorf("wc2: %q", lines[2])
	}
	if !strings.Contains(r.stderr, "1 of 2 workload clusters would fail") {
		t.Errorf("stderr: %s", r.stderr)
	}

	// Serving the hardened image too: nothing fails, and an image served
	// only now is reported as such.
	mgmt2 := writeFile(t, "mgmt2.yaml", `name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu, hardened: "false"}}
os_image_server_additional_selectors:
  hardened: {os: ubuntu, hardened: "true"}
`)
	onlyPlain := writeFile(t, "served2.yaml", servedDoc(true, sum("plain")))
	r = run(t, "plan", "-f", mgmt2, "--os-images", osImages, "--served", onlyPlain, "--cluster", "wc1="+wc1, "--cluster", "wc2="+wc2)
	if r.code != 0 || !strings.Contains(r.stdout, "newly served: "+sum("hardened")+"/ubuntu-hardened") {
		t.Fatalf("want exit 0 with wc1 newly served, got %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// Half the file inputs is a usage error.
	if r := run(t, "plan", "-f", mgmt, "--os-images", osImages, "--served", current); r.code != 2 || !strings.Contains(r.stderr, "give --served and --cluster together") {
		t.Errorf("want exit 2, got %d: %s", r.code, r.stderr)
	}
}
