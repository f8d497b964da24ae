package fleet

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// TestCheckReportsAFilenameThatIsNotServed: the sha256 is served and
// available, but not under the filename the cluster's URL asks for, so
// that URL answers 404: not served, and the message names the filename.
func TestCheckReportsAFilenameThatIsNotServed(t *testing.T) {
	plain := sum("plain")
	own := osimage.Catalog{"plain": catalog["plain"].Clone()}
	own["plain"]["filename"] = "mine.raw"
	in := Inputs{
		Namespace: "wc1",
		Clusters:  []ClusterValues{{Source: "ConfigMap wc1/values", Values: clusterValues(t, "name: wc1\nk8s_version: v1.32.5+rke2r1\ncapi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}\ncapm3: {os_image_selector: {os: ubuntu, hardened: false}}\n")}},
		Catalog:   own,
		Objects:   []*unstructured.Unstructured{template("wc1", "wc1-cp", "https://h/images/"+plain+"/old.raw", plain)},
	}
	needs, err := Needs(in)
	if err != nil {
		t.Fatal(err)
	}
	served := osimage.ServedSet{osimage.SHA256(plain): {Available: true, ImageKey: "m"}}

	// A copy without filenames (an older server, Sylva's): only the sha256
	// can be compared.
	if r := Check("wc1", "copy", needs, osimage.ServedOutput{Set: served}, true, nil); len(r.Problems()) != 0 {
		t.Errorf("without filenames: %+v", r.Problems())
	}

	files := osimage.ServedFilenames{osimage.SHA256(plain): {"mgmt.raw", "old.raw"}}
	r := Check("wc1", "copy", needs, osimage.ServedOutput{Set: served, Filenames: files}, true, nil)
	p := r.Problems()
	if len(p) != 1 || p[0].State != osimage.StateNotServed || strings.Join(p[0].Filenames, ",") != "mine.raw,old.raw" {
		t.Fatalf("want mine.raw not served: %+v", r)
	}
	for _, want := range []string{
		"image " + plain + "/plain is currently not served by mgmt cluster os-image-server under the filename mine.raw",
		"/images/" + plain + "/mine.raw would answer 404",
		"names this sha256 only as mgmt.raw, old.raw",
	} {
		if !strings.Contains(p[0].Message, want) {
			t.Errorf("message %q lacks %q", p[0].Message, want)
		}
	}

	// Served under both: all well, even while not available yet the state
	// is not-available, not not-served.
	files[osimage.SHA256(plain)] = []string{"mine.raw", "old.raw"}
	if r := Check("wc1", "copy", needs, osimage.ServedOutput{Set: served, Filenames: files}, true, nil); len(r.Problems()) != 0 {
		t.Errorf("both filenames served: %+v", r.Problems())
	}
	served[osimage.SHA256(plain)] = osimage.ServedImage{Available: false, ImageKey: "m"}
	if r := Check("wc1", "copy", needs, osimage.ServedOutput{Set: served, Filenames: files}, true, nil); r.Count(osimage.StateNotAvailable) != 1 {
		t.Errorf("not available yet: %+v", r)
	}
}

func TestPlanReportsAFilenameThatWouldNotBeServed(t *testing.T) {
	a := sum("a")
	needs := []Need{{SHA256: osimage.SHA256(a), ImageKey: "k", Filename: "wc.raw", By: "t"}}
	current := osimage.ServedSet{osimage.SHA256(a): {Available: true}}
	proposed := osimage.ServedOutput{Set: osimage.ServedSet{osimage.SHA256(a): {Available: true}}, Filenames: osimage.ServedFilenames{osimage.SHA256(a): {"mgmt.raw"}}}
	p := Plan("ns", needs, current, proposed, nil)
	if p.Verdict != WouldFail || !strings.Contains(p.Lines[0].Detail, a+"/k not served under the filename wc.raw (/images/"+a+"/wc.raw would answer 404") {
		t.Errorf("plan: %+v", p)
	}
	proposed.Filenames[osimage.SHA256(a)] = []string{"mgmt.raw", "wc.raw"}
	if p := Plan("ns", needs, current, proposed, nil); p.Verdict != Unchanged {
		t.Errorf("served under its filename: %+v", p)
	}
}

func TestGatherReadsServedFilenames(t *testing.T) {
	cm := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "copy", Namespace: "wc1"}, Data: map[string]string{
		"values.yaml":           "capm3_os_image_server_images:\n  " + sum("a") + ": {available: true, image_key: k}\n",
		"served-filenames.yaml": "served_filenames:\n  " + sum("a") + ": [a.raw]\n",
	}}
	g := Gather("wc1", "copy", []corev1.ConfigMap{cm}, nil)
	if served, known := g.Served.Filenames.Serves(osimage.SHA256(sum("a")), "a.raw"); !served || !known || g.Unreadable != nil {
		t.Errorf("filenames: %v, unreadable %v", g.Served.Filenames, g.Unreadable)
	}
	cm.Data["served-filenames.yaml"] = "served_filenames: [\n"
	if g := Gather("wc1", "copy", []corev1.ConfigMap{cm}, nil); g.Unreadable == nil || !strings.Contains(g.Unreadable.Error(), "served-filenames.yaml") {
		t.Errorf("a broken filenames document must be reported: %v", g.Unreadable)
	}
}
