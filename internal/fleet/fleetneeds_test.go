package fleet

import (
	"fmt"
	"slices"
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
		Report: osimage.CheckReport{Namespace: "wc1", Images: []osimage.ImageStatus{{SHA256: osimage.SHA256(a), ImageKey: "ubuntu"}, {SHA256: osimage.SHA256(c), ImageKey: "gone"}}},
		Catalog: osimage.Catalog{
			"ubuntu": rec(a, "oci://r1/ubuntu:1"),
			// A key that names other bytes than those needed is no
			// source of them.
			"gone": rec(b, "oci://r1/evil:1"),
		},
	}
	wc2 := NamespaceNeeds{
		Report:  osimage.CheckReport{Namespace: "wc2", Images: []osimage.ImageStatus{{SHA256: osimage.SHA256(a), ImageKey: "ubuntu-old"}}},
		Catalog: osimage.Catalog{"ubuntu-old": rec(a, "oci://r2/ubuntu:1")},
	}
	wc3 := NamespaceNeeds{
		// No key from the check: found by sha256.
		Report:  osimage.CheckReport{Namespace: "wc3", Images: []osimage.ImageStatus{{SHA256: osimage.SHA256(a)}}},
		Catalog: osimage.Catalog{"ubuntu": rec(a, "oci://r1/ubuntu:1")},
	}
	got := Aggregate([]NamespaceNeeds{wc3, wc2, wc1})
	if len(got.Images) != 2 || got.Images[0].SHA256 != osimage.SHA256(a) || got.Images[1].SHA256 != osimage.SHA256(c) {
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
	if data[osimage.FleetNeedsKey] != again[osimage.FleetNeedsKey] {
		t.Errorf("the document depends on the order of the namespaces:\n%s\n%s", data[osimage.FleetNeedsKey], again[osimage.FleetNeedsKey])
	}
	back, dropped, err := osimage.ParseFleetNeeds(data[osimage.FleetNeedsKey])
	if err != nil || len(dropped) != 0 || len(back.Images) != 2 || back.Images[0].Sources[1].Key != "ubuntu-old" {
		t.Fatalf("read back: %+v %v %v", back, dropped, err)
	}
	if _, _, err := osimage.ParseFleetNeeds("imagez: []\n"); err == nil {
		t.Error("an unknown field is accepted")
	}
}

// A record is cut down to the fields the image server reads: a field
// nobody reads, however large, never reaches the document (item 2).
func TestAggregateCopiesOnlyTheFieldsTheServerReads(t *testing.T) {
	sha := strings.Repeat("a", 64)
	rec := osimage.Image{osimage.FieldSHA256: sha, osimage.FieldURI: "oci://r1/ubuntu:1", osimage.FieldFilename: "disk.qcow2",
		osimage.FieldSize: "100", "description": strings.Repeat("a line\n", 100_000), "os": "ubuntu", "flags": map[string]any{"x": true}}
	got := Aggregate([]NamespaceNeeds{{
		Report:  osimage.CheckReport{Namespace: "wc1", Images: []osimage.ImageStatus{{SHA256: osimage.SHA256(sha), ImageKey: "ubuntu", Filenames: []string{"disk.qcow2"}}}},
		Catalog: osimage.Catalog{"ubuntu": rec},
	}})
	if len(got.Images) != 1 || len(got.Images[0].Sources) != 1 {
		t.Fatalf("needs: %+v", got)
	}
	img := got.Images[0].Sources[0].Image
	for f := range img {
		if !slices.Contains(osimage.NeedFields, f) {
			t.Errorf("field %s is copied", f)
		}
	}
	if img.Get(osimage.FieldURI) != "oci://r1/ubuntu:1" || img.Get(osimage.FieldSize) != "100" {
		t.Errorf("record: %v", img)
	}
	if rec["description"] == nil {
		t.Error("the catalog's own record was changed")
	}
}

// fleetOf makes n namespaces that each need `images` images with records
// of uriBytes-long URIs.
func fleetOf(prefix string, n, images, uriBytes int) []NamespaceNeeds {
	var out []NamespaceNeeds
	for i := range n {
		ns := fmt.Sprintf("%s-%04d", prefix, i)
		nn := NamespaceNeeds{Report: osimage.CheckReport{Namespace: ns}, Catalog: osimage.Catalog{}}
		for j := range images {
			sha := fmt.Sprintf("%064x", i*1000+j+1)
			key := fmt.Sprintf("img-%d", j)
			uri := "oci://registry.example.org/" + strings.Repeat("p", max(uriBytes-30, 1)) + ":1"
			nn.Report.Images = append(nn.Report.Images, osimage.ImageStatus{SHA256: osimage.SHA256(sha), ImageKey: key, Filenames: []string{key + ".raw"}})
			nn.Catalog[key] = osimage.Image{osimage.FieldSHA256: sha, osimage.FieldURI: uri, osimage.FieldFilename: key + ".raw", osimage.FieldSize: "1000"}
		}
		out = append(out, nn)
	}
	return out
}

// One namespace whose needs would push the document over a ConfigMap's
// 1 MiB is refused alone, with a reason for its status; every other
// namespace's needs are published, and the document fits (item 2).
func TestAggregateRefusesANamespaceOverItsShareAlone(t *testing.T) {
	fair := fleetOf("wc", 50, 3, 200)
	// 600 images with 3 KiB URIs: about 2 MB, alone.
	greedy := fleetOf("greedy", 1, 600, 3000)[0]
	all := append(slices.Clone(fair), greedy)
	got := Aggregate(all)
	data, err := got.Data("ConfigMap sylva-system/osimages-fleet-needs")
	if err != nil {
		t.Fatalf("the document does not fit: %v", err)
	}
	if n := len(got.Images); n != 150 {
		t.Errorf("%d needs published, want the 150 of the fair namespaces", n)
	}
	for _, img := range got.Images {
		if slices.Contains(img.Namespaces, greedy.Report.Namespace) {
			t.Fatalf("a need of the namespace over its share is published: %s", img.SHA256)
		}
	}
	if len(got.Refused) != 1 {
		t.Fatalf("refused: %+v", got.Refused)
	}
	r := got.Refused[0]
	if r.Namespace != greedy.Report.Namespace || r.SHA256 != "" || r.Reason != osimage.RefusedDocumentShare || !strings.Contains(r.Message, "fair share") {
		t.Errorf("refusal: %+v", r)
	}
	back, _, err := osimage.ParseFleetNeeds(data[osimage.FleetNeedsKey])
	if err != nil || len(back.Refused) != 1 || len(back.Images) != 150 {
		t.Fatalf("read back: %d images, %+v, %v", len(back.Images), back.Refused, err)
	}

	// Without it, the same namespaces give the same needs.
	alone := Aggregate(fair)
	if !slices.EqualFunc(alone.Images, got.Images, func(a, b osimage.FleetNeed) bool { return a.SHA256 == b.SHA256 }) {
		t.Error("the namespace over its share changed what the others publish")
	}

	// Many namespaces, each fair, that together pass the budget: the ones
	// that need the most are refused, the smallest are all published.
	many := append(fleetOf("small", 100, 1, 100), fleetOf("large", 100, 8, 1500)...)
	got = Aggregate(many)
	if _, err := got.Data("x"); err != nil {
		t.Fatalf("the document does not fit: %v", err)
	}
	published := map[string]bool{}
	for _, img := range got.Images {
		for _, ns := range img.Namespaces {
			published[ns] = true
		}
	}
	for i := range 100 {
		if ns := fmt.Sprintf("small-%04d", i); !published[ns] {
			t.Fatalf("%s, which needs little, is not published", ns)
		}
	}
	if len(got.Refused) == 0 {
		t.Error("nothing refused: the test does not pass the budget")
	}
}

// A record still over osimage.MaxNeedRecordBytes once cut down is left out and
// refused for its namespace; the need stays (without that source).
func TestAggregateRefusesARecordOverTheBound(t *testing.T) {
	nn := fleetOf("wc", 1, 1, osimage.MaxNeedRecordBytes+100)[0]
	got := Aggregate([]NamespaceNeeds{nn})
	if len(got.Images) != 1 || len(got.Images[0].Sources) != 0 {
		t.Fatalf("needs: %+v", got.Images)
	}
	if len(got.Refused) != 1 || got.Refused[0].Reason != osimage.RefusedInvalid || !strings.Contains(got.Refused[0].Message, "shorten its uri") {
		t.Fatalf("refused: %+v", got.Refused)
	}
}

// Each namespace's filenames are carried, and a malformed sha256 or
// filename (a forged status) is left out (item 1, item 4): the sha256 when
// the status is read (ParseStatus), the filename when it is aggregated.
func TestAggregateCarriesEachNamespacesFilenames(t *testing.T) {
	sha := strings.Repeat("a", 64)
	rec := func(name string) osimage.Image {
		return osimage.Image{osimage.FieldSHA256: sha, osimage.FieldURI: "oci://r1/ubuntu:1", osimage.FieldFilename: name}
	}
	forged, err := osimage.ParseCheckReport("namespace: evil\nservedSet: copy\nservedSetFound: true\nimages:\n" +
		"- {sha256: " + sha + ", imageKey: aaa, filenames: [evil.raw, ../x], state: served, neededBy: [x]}\n" +
		"- {sha256: " + strings.ToUpper(sha) + ", imageKey: aaa, state: served, neededBy: [x]}\n")
	if err != nil {
		t.Fatal(err)
	}
	got := Aggregate([]NamespaceNeeds{
		{Report: osimage.CheckReport{Namespace: "victim", Images: []osimage.ImageStatus{{SHA256: osimage.SHA256(sha), ImageKey: "ubuntu", Filenames: []string{"good.raw", "older.raw"}}}},
			Catalog: osimage.Catalog{"ubuntu": rec("good.raw")}},
		{Report: forged, Catalog: osimage.Catalog{"aaa": rec("evil.raw")}},
	})
	if len(got.Images) != 1 {
		t.Fatalf("needs: %+v", got.Images)
	}
	f := got.Images[0].Filenames
	if strings.Join(f["victim"], ",") != "good.raw,older.raw" || strings.Join(f["evil"], ",") != "evil.raw" {
		t.Errorf("filenames: %v", f)
	}
}
