package selection

import (
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

func sha(c byte) string { return strings.Repeat(string(c), 64) }

func need(s, uri string, size string, namespaces ...string) fleet.FleetNeed {
	img := osimage.Image{osimage.FieldSHA256: s, osimage.FieldURI: uri, osimage.FieldFilename: "disk.qcow2"}
	if size != "" {
		img[osimage.FieldSize] = size
	}
	return fleet.FleetNeed{SHA256: s, Namespaces: namespaces,
		Sources: []fleet.NeedSource{{Key: "k-" + s[:1], Image: img, Namespaces: namespaces}}}
}

var fleetMgmtValues = values.Values{"os_images_oci_registries": map[string]any{
	"sylva":    map[string]any{"url": "oci://Registry.Example.org:443/sylva"},
	"disabled": map[string]any{"url": "oci://off.example.org/x", "enabled": false},
}}

func TestFleetNeedsPolicy(t *testing.T) {
	needs := fleet.FleetNeeds{Images: []fleet.FleetNeed{
		need(sha('a'), "oci://registry.example.org/other/path:1.0", "10", "wc1"),
		need(sha('b'), "oci://evil.example.org/sylva/x:1.0", "10", "wc1"),
		need(sha('c'), "oci://off.example.org/x/y:1", "10", "wc1"),
		need(sha('d'), "https://files.example.org/dib/x.qcow2", "10", "wc2"),
		need(sha('e'), "https://files.example.org.evil.com/dib/x.qcow2", "10", "wc2"),
		need(sha('f'), "https://files.example.org/dib/../../etc/x", "10", "wc2"),
		need(sha('0'), "oci://registry.example.org/already:1", "10", "wc1"),
		{SHA256: sha('9'), Namespaces: []string{"wc3"}},
	}}
	selected := map[string]Wanted{sha('0'): {SHA256: sha('0')}}
	added, refused := FleetNeeds(fleetMgmtValues, needs, selected, nil, FleetPolicy{AllowPrefixes: []string{"https://files.example.org/dib/"}})
	if len(added) != 2 || added[sha('a')].Key != "k-a" || added[sha('d')].Key != "k-d" {
		t.Fatalf("added: %v", added)
	}
	if _, ok := added[sha('0')]; ok {
		t.Error("an image the management already selects is added again")
	}
	want := map[string]string{
		sha('b'): "registry evil.example.org is not allowed by the management values",
		sha('c'): "registry off.example.org is not allowed by the management values",
		sha('e'): "is under no prefix allowed",
		sha('f'): "a .. segment",
		sha('9'): "no os-images-info",
	}
	if len(refused) != len(want) {
		t.Fatalf("refused: %+v", refused)
	}
	for _, r := range refused {
		if !strings.Contains(r.Message, want[r.SHA256]) {
			t.Errorf("%s: %q does not say %q", r.SHA256[:1], r.Message, want[r.SHA256])
		}
	}
}

func TestFleetNeedsQuotas(t *testing.T) {
	uri := "oci://registry.example.org/sylva/x:1"
	needs := fleet.FleetNeeds{Images: []fleet.FleetNeed{
		need(sha('c'), uri, "10", "wc1"),
		need(sha('a'), uri, "10", "wc1", "wc2"),
		need(sha('b'), uri, "10", "wc1"),
		need(sha('d'), uri, "10", "wc2"),
	}}
	added, refused := FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{MaxImages: 1})
	// a (both), then b refused for wc1; c refused for wc1; d: wc2 is full.
	if len(added) != 1 || added[sha('a')].SHA256 == "" {
		t.Fatalf("added: %v", added)
	}
	if len(refused) != 3 {
		t.Fatalf("refused: %+v", refused)
	}
	for _, r := range refused {
		if r.Message != "quota of 1 images reached" || r.Reason != RefusedImages {
			t.Errorf("%+v", r)
		}
	}
	added, refused = FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{MaxBytes: 25})
	if len(added) != 3 || len(refused) != 1 || refused[0].SHA256 != sha('c') || !strings.HasPrefix(refused[0].Message, "quota of 25 bytes reached") {
		t.Fatalf("bytes quota: added %d, refused %+v", len(added), refused)
	}
}

// A new need never evicts an image served already: what is served is
// admitted first, whatever its sha256.
func TestFleetNeedsKeepWhatIsServed(t *testing.T) {
	uri := "oci://registry.example.org/sylva/x:1"
	needs := fleet.FleetNeeds{Images: []fleet.FleetNeed{need(sha('b'), uri, "10", "wc1"), need(sha('a'), uri, "10", "wc1")}}
	served := func(s string) bool { return s == sha('b') }
	added, refused := FleetNeeds(fleetMgmtValues, needs, nil, served, FleetPolicy{MaxImages: 1})
	if _, ok := added[sha('b')]; !ok || len(added) != 1 || len(refused) != 1 || refused[0].SHA256 != sha('a') {
		t.Fatalf("added %v, refused %+v", added, refused)
	}
}
