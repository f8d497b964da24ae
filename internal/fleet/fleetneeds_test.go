package fleet

import (
	"errors"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

func TestAggregateFleetNeeds(t *testing.T) {
	a, b, c := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
	rec := func(sha, uri string) osimage.Image {
		return osimage.Image{osimage.FieldSHA256: sha, osimage.FieldURI: uri, osimage.FieldFilename: "disk.qcow2"}
	}
	wc1 := NamespaceNeeds{
		Report: Report{Namespace: "wc1", Images: []ImageStatus{{SHA256: a, ImageKey: "ubuntu"}, {SHA256: c, ImageKey: "gone"}}},
		Catalog: osimage.Catalog{
			"ubuntu": rec(a, "oci://r1/ubuntu:1"),
			// A key that names other bytes than those needed is no
			// source of them.
			"gone": rec(b, "oci://r1/evil:1"),
		},
	}
	wc2 := NamespaceNeeds{
		Report:  Report{Namespace: "wc2", Images: []ImageStatus{{SHA256: a, ImageKey: "ubuntu-old"}}},
		Catalog: osimage.Catalog{"ubuntu-old": rec(a, "oci://r2/ubuntu:1")},
	}
	wc3 := NamespaceNeeds{
		// No key from the check: found by sha256.
		Report:  Report{Namespace: "wc3", Images: []ImageStatus{{SHA256: a}}},
		Catalog: osimage.Catalog{"ubuntu": rec(a, "oci://r1/ubuntu:1")},
	}
	got := Aggregate([]NamespaceNeeds{wc3, wc2, wc1})
	if len(got.Images) != 2 || got.Images[0].SHA256 != a || got.Images[1].SHA256 != c {
		t.Fatalf("images: %+v", got.Images)
	}
	need := got.Images[0]
	if strings.Join(need.Namespaces, ",") != "wc1,wc2,wc3" {
		t.Errorf("namespaces: %v", need.Namespaces)
	}
	if len(need.Sources) != 2 {
		t.Fatalf("sources: %+v", need.Sources)
	}
	if s := need.Sources[0]; s.Key != "ubuntu" || s.Image.Get(osimage.FieldURI) != "oci://r1/ubuntu:1" || strings.Join(s.Namespaces, ",") != "wc1,wc3" {
		t.Errorf("first source: %+v", s)
	}
	if s := need.Sources[1]; s.Key != "ubuntu-old" || strings.Join(s.Namespaces, ",") != "wc2" {
		t.Errorf("second source: %+v", s)
	}
	if gone := got.Images[1]; len(gone.Sources) != 0 || strings.Join(gone.Namespaces, ",") != "wc1" {
		t.Errorf("a need without a matching record: %+v", gone)
	}

	// The document reads back, and is the same whatever the order of the
	// namespaces.
	data, err := got.Data("ConfigMap sylva-system/osimages-fleet-needs")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Aggregate([]NamespaceNeeds{wc1, wc2, wc3}).Data("x")
	if data[FleetNeedsKey] != again[FleetNeedsKey] {
		t.Errorf("the document depends on the order of the namespaces:\n%s\n%s", data[FleetNeedsKey], again[FleetNeedsKey])
	}
	back, err := ParseFleetNeeds(data[FleetNeedsKey])
	if err != nil || len(back.Images) != 2 || back.Images[0].Sources[1].Key != "ubuntu-old" {
		t.Fatalf("read back: %+v %v", back, err)
	}
	if _, err := ParseFleetNeeds("images:\n- sha256: ABC\n  namespaces: [wc1]\n"); err == nil || !strings.Contains(err.Error(), "lowercase hex") {
		t.Errorf("a bad sha256 is accepted: %v", err)
	}
	if _, err := ParseFleetNeeds("imagez: []\n"); err == nil {
		t.Error("an unknown field is accepted")
	}
}

func TestFleetNeedsTooLarge(t *testing.T) {
	var f FleetNeeds
	for i := range 3000 {
		sha := strings.Repeat("0", 60) + strings.Repeat("f", 4)
		sha = sha[:60] + string(rune('a'+i%6)) + sha[61:]
		f.Images = append(f.Images, FleetNeed{SHA256: sha, Namespaces: []string{strings.Repeat("n", 300)}})
	}
	_, err := f.Data("ConfigMap sylva-system/osimages-fleet-needs")
	var size *osimage.SizeError
	if !errors.As(err, &size) || !strings.Contains(err.Error(), "osimages-fleet-needs") {
		t.Fatalf("want a size error naming the ConfigMap, got %v", err)
	}
}
