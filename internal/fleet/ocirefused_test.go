package fleet

import (
	"errors"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// A CAPM3 that refuses oci:// templates makes the levels whose values ask
// for them an error of Needs, and a "would fail" of the plan (not a
// "cannot tell"); image URLs are not its concern.
func TestOCIRefusedByCAPM3(t *testing.T) {
	const sha = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	catalog := osimage.Catalog{"ubuntu": {"sha256": sha, "filename": "u.raw", "image-format": "raw", "size": "1048576", "os": "ubuntu", "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"}}
	refused := &metal3.OCIRefusedError{Version: "v1beta1"}
	in := func(delivery string) Inputs {
		v, err := values.Parse([]byte("name: wc1\nk8s_version: v1.32.5+rke2r1\ncapi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}\ncapm3: {image_delivery: " + delivery + ", os_image_selector: {os: ubuntu}, image_provisioning_host: 192.0.2.10}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return Inputs{Namespace: "ns", Clusters: []ClusterValues{{Source: "ConfigMap ns/wc1", Values: v}}, Catalog: catalog, OCIRefused: refused}
	}
	needs, err := Needs(in("oci"))
	if !errors.Is(err, refused) || len(needs) != 1 || !strings.Contains(err.Error(), "ConfigMap ns/wc1 .control_plane.capm3.image_delivery: oci: ") {
		t.Fatalf("oci: needs %v, error %v; want the refusal naming the level", needs, err)
	}
	p := Plan("ns", needs, osimage.ServedSet{}, osimage.ServedOutput{Set: osimage.ServedSet{sha: {Available: true}}}, err)
	if p.Verdict != WouldFail || len(p.Errors) != 0 {
		t.Fatalf("plan: %+v, want would fail", p)
	}
	if _, err := Needs(in("http")); err != nil {
		t.Fatalf("http: %v", err)
	}
}
