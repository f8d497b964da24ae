package capm3

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// benchFixture builds a 200-image catalog (5 OSes x plain/hardened x 10
// k8s versions x rke2/kubeadm), a served set holding all of it, and the
// values of n clusters, each with a control plane and 3 machine
// deployments that pick their image by selector.
func benchFixture(n int) (osimage.Catalog, osimage.ServedSet, []values.Values) {
	oses := []string{"ubuntu", "opensuse", "leapmicro", "rocky", "debian"}
	cat := osimage.Catalog{}
	served := osimage.ServedSet{}
	version := func(v int, rke2 bool) string {
		s := fmt.Sprintf("1.%d.%d", 25+v, v+3)
		if rke2 {
			s += "+rke2r1"
		}
		return s
	}
	for _, os := range oses {
		for _, hardened := range []string{"false", "true"} {
			for v := range 10 {
				for _, rke2 := range []bool{true, false} {
					flavor := map[bool]string{true: "rke2", false: "kubeadm"}[rke2]
					key := fmt.Sprintf("%s-%s-%s-%d", os, map[string]string{"false": "plain", "true": "hardened"}[hardened], flavor, v)
					sum := sha256.Sum256([]byte(key))
					h := hex.EncodeToString(sum[:])
					cat[key] = osimage.Image{
						"sha256": h, "filename": key + ".raw", "image-format": "raw",
						"os": os, "os-release": "x", "hardened": hardened, "flavor": "plain",
						"k8s-flavor": flavor, "k8s-version": version(v, rke2),
						"oci-image-registry-key": "sylva", "commit-tag": "0.7.6",
						"uri": "oci://registry.example.org/sylva/" + key + ":0.7.6",
					}
					served[osimage.SHA256(h)] = osimage.ServedImage{Available: true, ImageKey: key}
				}
			}
		}
	}
	clusters := make([]values.Values, n)
	for i := range clusters {
		rke2 := i%2 == 0
		bootstrap := map[bool]string{true: "cabpr", false: "cabpk"}[rke2]
		clusters[i] = values.Values{
			"name":           fmt.Sprintf("cluster-%d", i),
			"k8s_version":    "v" + version(i%10, rke2),
			"capi_providers": map[string]any{"infra_provider": "capm3", "bootstrap_provider": bootstrap},
			"capm3": map[string]any{
				"os_image_selector":       map[string]any{"os": "ubuntu", "hardened": false},
				"image_provisioning_host": "192.0.2.10",
			},
			"control_plane":              map[string]any{"capm3": map[string]any{}},
			"machine_deployment_default": map[string]any{"capm3": map[string]any{"automatedCleaningMode": "disabled"}},
			"machine_deployments": map[string]any{
				"md0": map[string]any{"capm3": map[string]any{"os_image_selector": map[string]any{"hardened": "true"}}},
				"md1": map[string]any{"capm3": map[string]any{"os_image_selector": map[string]any{"os": "opensuse"}}},
				"md2": map[string]any{"capm3": map[string]any{
					"os_image_selector": map[string]any{"os": "leap.*", "hardened": "true"},
					"hostSelector":      map[string]any{"matchLabels": map[string]any{"pool": "md2"}},
				}},
			},
		}
	}
	return cat, served, clusters
}

func benchRender(b *testing.B, marshal bool) {
	cat, served, clusters := benchFixture(1000)
	for b.Loop() {
		for _, v := range clusters {
			ts, err := Render(Input{Values: v, Catalog: cat, Served: served})
			if err != nil {
				b.Fatal(err)
			}
			if len(ts) != 4 {
				b.Fatalf("%d templates", len(ts))
			}
			if marshal {
				if _, err := MarshalYAML(ts); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}

// BenchmarkRender1000Clusters: one op renders 1,000 clusters of 4
// templates each, every image picked by selector out of 200.
func BenchmarkRender1000Clusters(b *testing.B) { benchRender(b, false) }

// BenchmarkRenderYAML1000Clusters is the same plus writing the YAML.
func BenchmarkRenderYAML1000Clusters(b *testing.B) { benchRender(b, true) }

func TestBenchFixturePicksDistinctImages(t *testing.T) {
	cat, served, clusters := benchFixture(20)
	if len(cat) != 200 {
		t.Fatalf("catalog of %d images", len(cat))
	}
	for _, v := range clusters {
		ts, err := Render(Input{Values: v, Catalog: cat, Served: served})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, tpl := range ts {
			seen[tpl.ImageKey] = true
		}
		if len(seen) != 4 {
			t.Errorf("%s: picks %v", v["name"], seen)
		}
	}
}
