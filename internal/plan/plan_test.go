package plan

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/values"
)

func sum(s string) osimage.SHA256 {
	h := sha256.Sum256([]byte(s))
	sha, err := osimage.ParseSHA256(hex.EncodeToString(h[:]))
	if err != nil {
		panic(err)
	}
	return sha
}

// catalogDoc is a catalog of two images, the management's and each
// cluster's own.
var catalogDoc = fmt.Sprintf(`os_images:
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

const mgmtDoc = `name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu, hardened: "false"}}
`

// clusterDoc uses the plain image for its control plane and, unless
// plainOnly, the hardened one for md0.
func clusterDoc(name string, plainOnly bool) string {
	doc := `name: ` + name + `
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {os: ubuntu, hardened: false}
  image_provisioning_host: 192.0.2.10
`
	if !plainOnly {
		doc += "machine_deployments:\n  md0:\n    capm3:\n      os_image_selector: {hardened: true}\n"
	}
	return doc + catalogDoc
}

func parse(t *testing.T, doc string) values.Values {
	t.Helper()
	v, err := values.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func cluster(t *testing.T, namespace string, plainOnly bool) fleet.Inputs {
	return fleet.Inputs{Namespace: namespace, Clusters: []fleet.ClusterValues{{Source: namespace + ".yaml", Values: parse(t, clusterDoc(namespace, plainOnly))}}}
}

// TestAgainst: management values that stop serving an image fail the
// clusters that use it, and only them; a cluster whose inputs cannot be
// read cannot be told, which fails too; an image served only now is said
// to be.
func TestAgainst(t *testing.T) {
	mgmt := parse(t, mgmtDoc)
	cat, err := osimage.ParseInfo([]byte(catalogDoc))
	if err != nil {
		t.Fatal(err)
	}
	proposal, err := Propose(mgmt, cat)
	if err != nil {
		t.Fatalf("a clean selection: %v", err)
	}
	unreadable := cluster(t, "wc3", true)
	unreadable.Unreadable = errors.New("ConfigMap wc3/values: not YAML")
	both := osimage.ServedSet{sum("plain"): {Available: true}, sum("hardened"): {Available: true}}
	got := proposal.Against(both, []fleet.Inputs{cluster(t, "wc1", false), cluster(t, "wc2", true), unreadable}, nil)
	if len(got) != 3 {
		t.Fatalf("got %d clusters, want 3: %+v", len(got), got)
	}
	wantFail := fmt.Sprintf("would fail: %s/ubuntu-hardened no longer served (needed by wc1.yaml .machine_deployments.md0.capm3)", sum("hardened"))
	if c := got[0]; c.Namespace != "wc1" || !c.Fails || len(c.Lines) != 1 || c.Lines[0] != wantFail {
		t.Errorf("wc1, which uses the image no longer served: %+v, want it to fail with %q", c, wantFail)
	}
	if c := got[1]; c.Namespace != "wc2" || c.Fails || strings.Join(c.Lines, "|") != "unchanged" {
		t.Errorf("wc2, which uses only the image still served: %+v, want unchanged", c)
	}
	if c := got[2]; !c.Fails || len(c.Lines) == 0 || !strings.HasPrefix(c.Lines[0], "cannot tell: ") || !strings.Contains(c.Lines[0], "not YAML") {
		t.Errorf("wc3, whose inputs cannot be read: %+v, want it to fail, saying why", c)
	}

	// From a served set without the plain image, the proposal serves it
	// anew; wc1 still fails on the hardened one it never had.
	onlyHardened := osimage.ServedSet{sum("hardened"): {Available: true}}
	got = proposal.Against(onlyHardened, []fleet.Inputs{cluster(t, "wc2", true)}, nil)
	if c := got[0]; c.Fails || strings.Join(c.Lines, "|") != fmt.Sprintf("newly served: %s/ubuntu-plain", sum("plain")) {
		t.Errorf("wc2 from a set without its image: %+v, want it newly served", c)
	}
}

// TestAgainstWithTheFleetsNeeds: with the fleet-needs policy, each
// refusal is said beside the failure it leaves; a need the policy admits
// is served and fails nothing. Clusters given without their own catalog
// have needs with no record, which serve refuses.
func TestAgainstWithTheFleetsNeeds(t *testing.T) {
	mgmt := parse(t, mgmtDoc)
	cat, err := osimage.ParseInfo([]byte(catalogDoc))
	if err != nil {
		t.Fatal(err)
	}
	proposal, err := Propose(mgmt, cat)
	if err != nil {
		t.Fatal(err)
	}
	both := osimage.ServedSet{sum("plain"): {Available: true}, sum("hardened"): {Available: true}}
	got := proposal.Against(both, []fleet.Inputs{cluster(t, "wc1", false)}, &servedset.FleetPolicy{MaxImages: 10})
	if c := got[0]; !c.Fails || len(c.Lines) != 1 || !strings.Contains(c.Lines[0], "; serve --serve-fleet-needs would refuse it: ") {
		t.Errorf("wc1 with a need serve refuses: %+v, want the failure with serve's reason", c)
	}
}

// TestAgainstReportsASwitchOfDelivery: a cluster whose values move its
// control plane from image URLs to oci:// (and back) is told that the
// nodes roll, as is one whose Metal3 objects hold the oci:// URLs pinned
// to a manifest digest that render wrote before; the served set alone
// decides whether it fails.
func TestAgainstReportsASwitchOfDelivery(t *testing.T) {
	cat, err := osimage.ParseInfo([]byte(catalogDoc))
	if err != nil {
		t.Fatal(err)
	}
	proposal, err := Propose(parse(t, mgmtDoc), cat)
	if err != nil {
		t.Fatal(err)
	}
	template := func(url string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3MachineTemplate",
			"metadata": map[string]any{"name": "wc-cp-1", "namespace": "wc"},
			"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{"image": map[string]any{"url": url, "format": "raw"}}}},
		}}
	}
	httpURL := "https://192.0.2.10/images/" + string(sum("plain")) + "/ubuntu-plain.raw"
	ociURL := "oci://192.0.2.10/images/" + string(sum("plain")) + ":raw"
	// What render wrote before the disk type's tag.
	digestURL := "oci://192.0.2.10/images/" + string(sum("plain")) + "@sha256:" + strings.Repeat("0", 64)
	served := osimage.ServedSet{sum("plain"): {Available: true}}
	for _, c := range []struct {
		name, extra, live string
		want              string
	}{
		{"to oci", "  image_delivery: oci\n", httpURL, "its Metal3 objects take it by image URLs, and the cluster values now give it by oci:// URLs"},
		{"back to http", "", ociURL, "its Metal3 objects take it by oci:// URLs, and the cluster values now give it by image URLs"},
		{"no switch", "  image_delivery: oci\n", ociURL, ""},
		// An upgrade of osimages: the digest form goes, once, gated by plan.
		{"digest to tag", "  image_delivery: oci\n", digestURL, "its Metal3 objects take it by oci:// URLs pinned to a manifest digest (of a disk format Ironic cannot tell), and the cluster values now give it by oci:// URLs"},
		{"digest back to http", "", digestURL, "its Metal3 objects take it by oci:// URLs pinned to a manifest digest (of a disk format Ironic cannot tell), and the cluster values now give it by image URLs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := strings.Replace(clusterDoc("wc", true), "  image_provisioning_host: 192.0.2.10\n", "  image_provisioning_host: 192.0.2.10\n"+c.extra, 1)
			in := fleet.Inputs{Namespace: "wc", Clusters: []fleet.ClusterValues{{Source: "wc.yaml", Values: parse(t, doc)}},
				Objects: []*unstructured.Unstructured{template(c.live)}}
			got := proposal.Against(served, []fleet.Inputs{in}, nil)[0]
			lines := strings.Join(got.Lines, "|")
			if got.Fails {
				t.Errorf("a switch of delivery fails nothing: %+v", got)
			}
			if c.want == "" {
				if lines != "unchanged" {
					t.Errorf("got %q, want unchanged", lines)
				}
				return
			}
			if !strings.HasPrefix(lines, "rolls nodes: "+string(sum("plain"))+"/ubuntu-plain: "+c.want) || !strings.Contains(lines, "Metal3MachineTemplate wc/wc-cp-1") || !strings.Contains(lines, "wc.yaml .control_plane.capm3") {
				t.Errorf("got %q, want the roll said, with who needs the image", lines)
			}
		})
	}
}
