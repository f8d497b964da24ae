package propagate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// digest is the sha256 of an image called name in these tests.
func digest(name string) osimage.SHA256 {
	h := sha256.Sum256([]byte(name))
	return osimage.SHA256(hex.EncodeToString(h[:]))
}

// servedData is the data of an image server's output serving names, each
// under the filename NAME.raw, and refusing what refused says.
func servedData(t testing.TB, names []string, refused osimage.RefusedNeeds) map[string]string {
	t.Helper()
	out := osimage.ServedOutput{Set: osimage.ServedSet{}, Filenames: osimage.ServedFilenames{}, OCI: osimage.ServedOCI{}, Refused: refused}
	for _, n := range names {
		out.Set[digest(n)] = osimage.ServedImage{Available: true, ImageKey: "mgmt-" + n}
		out.Filenames[digest(n)] = []string{n + ".raw"}
		out.OCI[digest(n)] = osimage.OCIServed{Repository: osimage.OCIRepository(digest(n)), Manifest: osimage.OCILayerDigest(digest("manifest of " + n))}
	}
	data, err := out.ConfigMapData("test source")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// catalogDoc is an os-images-info document listing names, as the catalog
// writes it.
func catalogDoc(t testing.TB, names ...string) string {
	t.Helper()
	c := osimage.Catalog{}
	for _, n := range names {
		c[n] = osimage.Image{osimage.FieldSHA256: string(digest(n)), osimage.FieldFilename: n + ".raw", osimage.FieldImageFormat: "raw"}
	}
	doc, err := osimage.MarshalInfo(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

func configMap(ns, name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
}

// statusConfigMap is osimages-status as the check controller writes it.
func statusConfigMap(t *testing.T, r osimage.CheckReport) *corev1.ConfigMap {
	t.Helper()
	doc, err := osimage.MarshalCheckReport(r)
	if err != nil {
		t.Fatal(err)
	}
	cm := configMap(r.Namespace, osimage.StatusConfigMapName, map[string]string{osimage.StatusKey: string(doc)})
	cm.Labels = map[string]string{osimage.StatusLabel: ""}
	return cm
}

// readCopy parses a copy's data the way the check and render do.
func readCopy(t *testing.T, data map[string]string) osimage.ServedOutput {
	t.Helper()
	g := fleet.Gather("wc1", "copy", []corev1.ConfigMap{*configMap("wc1", "copy", data)}, nil)
	if g.Unreadable != nil || !g.ServedFound {
		t.Fatalf("the check cannot read the copy (found %v): %v", g.ServedFound, g.Unreadable)
	}
	return g.Served
}

func sortedSHA256s[V any](m map[osimage.SHA256]V) []osimage.SHA256 {
	return slices.Sorted(maps.Keys(m))
}

func shas(names ...string) []osimage.SHA256 {
	out := make([]osimage.SHA256, len(names))
	for i, n := range names {
		out[i] = digest(n)
	}
	slices.Sort(out)
	return out
}

func picksOf(t *testing.T, catalog *corev1.ConfigMap, status *corev1.ConfigMap) Picks {
	t.Helper()
	var set map[osimage.SHA256]bool
	var err error
	if catalog != nil {
		set, err = CatalogSHA256s(catalog)
	}
	var needed map[osimage.SHA256]bool
	if status != nil {
		needed = StatusSHA256s(status)
	}
	return NewPicks(osimage.InfoConfigMapName, set, catalog != nil, err, needed)
}

func TestFilteredKeepsWhatTheCatalogCanPick(t *testing.T) {
	refused := osimage.RefusedNeeds{
		{SHA256: digest("b"), Namespace: "wc1", Reason: osimage.RefusedRegistry, Message: "b refused for wc1"},
		{SHA256: digest("c"), Namespace: "wc2", Reason: osimage.RefusedRegistry, Message: "c refused for wc2"},
		{SHA256: "", Namespace: "wc1", Reason: osimage.RefusedDocumentShare, Message: "all of wc1"},
	}
	data := servedData(t, []string{"a", "b", "c", "d"}, refused)
	data["extra.yaml"] = "kept as it is"
	src := ReadServedSource(configMap("sylva-system", "served", data))

	// The catalog names a and b, which are served, e which is not, and two
	// images no render can pick: a sha256 in capitals, and a null entry.
	doc := catalogDoc(t, "a", "b", "e") + "  upper:\n    sha256: " + strings.ToUpper(string(digest("c"))) + "\n  empty: null\n"
	picks := picksOf(t, configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: doc}), nil)
	if picks.Unreadable != nil {
		t.Fatal(picks.Unreadable)
	}
	got, binary, note, err := src.Filtered("wc1", picks)
	if err != nil {
		t.Fatal(err)
	}
	out := readCopy(t, got)
	if want := shas("a", "b"); !slices.Equal(sortedSHA256s(out.Set), want) {
		t.Errorf("served set %v, want %v", sortedSHA256s(out.Set), want)
	}
	if out.Set[digest("a")] != (osimage.ServedImage{Available: true, ImageKey: "mgmt-a"}) {
		t.Errorf("entry of a changed: %+v", out.Set[digest("a")])
	}
	if want := shas("a", "b"); !slices.Equal(sortedSHA256s(out.Filenames), want) || out.Filenames[digest("b")][0] != "b.raw" {
		t.Errorf("filenames %v", out.Filenames)
	}
	if want := shas("a", "b"); !slices.Equal(sortedSHA256s(out.OCI), want) || out.OCI[digest("a")].Manifest != osimage.OCILayerDigest(digest("manifest of a")) {
		t.Errorf("OCI references %v", out.OCI)
	}
	if len(out.Refused) != 2 || out.Refused[0].Namespace != "wc1" || out.Refused[1].Namespace != "wc1" {
		t.Errorf("refused needs %+v, want wc1's two", out.Refused)
	}
	if got["extra.yaml"] != "kept as it is" || binary != nil {
		t.Errorf("other keys: %q, binary %v", got["extra.yaml"], binary)
	}
	if !strings.Contains(note, "3 sha256s named by ConfigMap os-images-info") || !strings.Contains(note, "2 served entries kept") {
		t.Errorf("note %q", note)
	}

	// Another namespace with a catalog of its own gets its own entries,
	// and none of wc1's refusals.
	picks = picksOf(t, configMap("wc2", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: catalogDoc(t, "c", "d")}), nil)
	got, _, _, err = src.Filtered("wc2", picks)
	if err != nil {
		t.Fatal(err)
	}
	out = readCopy(t, got)
	if want := shas("c", "d"); !slices.Equal(sortedSHA256s(out.Set), want) {
		t.Errorf("wc2: served set %v, want %v", sortedSHA256s(out.Set), want)
	}
	if len(out.Refused) != 1 || out.Refused[0].SHA256 != digest("c") {
		t.Errorf("wc2: refused %+v", out.Refused)
	}

	// A namespace nobody refuses anything gets no refused-needs key, as
	// from a server that refuses nothing.
	got, _, _, err = src.Filtered("wc3", picks)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[osimage.RefusedNeedsKey]; ok {
		t.Errorf("wc3 got %s: %q", osimage.RefusedNeedsKey, got[osimage.RefusedNeedsKey])
	}
}

// TestFilteredKeepsNothingUnvouchedFor: no catalog, a catalog that cannot
// be read, or a source that is not a served set give a copy with no entry
// (a render then fails, "not served"), never the whole set.
func TestFilteredKeepsNothingUnvouchedFor(t *testing.T) {
	served := ReadServedSource(configMap("sylva-system", "served", servedData(t, []string{"a", "b"}, nil)))
	tests := []struct {
		name       string
		src        ServedSource
		catalog    *corev1.ConfigMap
		unreadable bool
		note       string
	}{
		{name: "no catalog", src: served, note: "no ConfigMap os-images-info in the namespace"},
		{name: "catalog not YAML", src: served, unreadable: true, note: "ConfigMap os-images-info cannot be read",
			catalog: configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: "os_images: ["})},
		{name: "catalog of the wrong shape", src: served, unreadable: true, note: "os_images: must be a map",
			catalog: configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: "os_images: [a, b]"})},
		{name: "catalog without values.yaml", src: served, unreadable: true, note: "it has no data key values.yaml",
			catalog: configMap("wc1", osimage.InfoConfigMapName, map[string]string{"other": catalogDoc(t, "a")})},
		{name: "source not a served set",
			src:     ReadServedSource(configMap("sylva-system", "served", map[string]string{osimage.ValuesKey: "capm3_os_image_server_images:\n  " + string(digest("a")) + ": {available: true, image_key: a, url: x}\n"})),
			catalog: configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: catalogDoc(t, "a")}),
			note:    `the source is not a served set (values.yaml: parsing capm3_os_image_server_images document`},
		{name: "source without values.yaml",
			src:     ReadServedSource(configMap("sylva-system", "served", map[string]string{"other": "x"})),
			catalog: configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: catalogDoc(t, "a")}),
			note:    "it has no data key values.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			picks := picksOf(t, tt.catalog, nil)
			if (picks.Unreadable != nil) != tt.unreadable {
				t.Errorf("unreadable: %v", picks.Unreadable)
			}
			got, _, note, err := tt.src.Filtered("wc1", picks)
			if err != nil {
				t.Fatal(err)
			}
			if out := readCopy(t, got); len(out.Set) != 0 {
				t.Errorf("copy keeps %v", sortedSHA256s(out.Set))
			}
			if !strings.Contains(note, tt.note) {
				t.Errorf("note %q does not say %q", note, tt.note)
			}
		})
	}
}

// TestFilteredKeepsWhatTheCheckFoundNeeded: a template made from an earlier
// catalog still needs its image; the check lists it in osimages-status,
// and its entry stays in the copy so that the check does not call a
// served image unserved.
func TestFilteredKeepsWhatTheCheckFoundNeeded(t *testing.T) {
	src := ReadServedSource(configMap("sylva-system", "served", servedData(t, []string{"old", "new", "other"}, nil)))
	catalog := configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: catalogDoc(t, "new")})
	report := osimage.CheckReport{Namespace: "wc1", Images: []osimage.ImageStatus{
		{SHA256: digest("old"), State: osimage.StateServed, NeededBy: []string{"Metal3MachineTemplate wc1/old"}},
		{SHA256: digest("gone"), State: osimage.StateNotServed, NeededBy: []string{"Metal3MachineTemplate wc1/gone"}},
	}}
	status := statusConfigMap(t, report)
	got, _, note, err := src.Filtered("wc1", picksOf(t, catalog, status))
	if err != nil {
		t.Fatal(err)
	}
	if want := shas("old", "new"); !slices.Equal(sortedSHA256s(readCopy(t, got).Set), want) {
		t.Errorf("served set %v, want %v", sortedSHA256s(readCopy(t, got).Set), want)
	}
	if !strings.Contains(note, "2 needed by osimages-status") {
		t.Errorf("note %q", note)
	}

	// A ConfigMap of that name that the check did not write (no label)
	// adds nothing.
	delete(status.Labels, osimage.StatusLabel)
	got, _, _, err = src.Filtered("wc1", picksOf(t, catalog, status))
	if err != nil {
		t.Fatal(err)
	}
	if want := shas("new"); !slices.Equal(sortedSHA256s(readCopy(t, got).Set), want) {
		t.Errorf("unlabelled status: served set %v, want %v", sortedSHA256s(readCopy(t, got).Set), want)
	}
}

// TestDecideFilteredCopy: a rule with a Catalog writes the filtered data,
// and a source change that adds nothing to a copy leaves it unwritten.
func TestDecideFilteredCopy(t *testing.T) {
	r := rule
	r.Catalog = osimage.InfoConfigMapName
	wc := namespace("wc1", map[string]string{"wc": ""})
	src := configMap("sylva-system", "served", servedData(t, []string{"a", "b", "c"}, nil))
	src.UID = "source-uid"
	catalog := configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: catalogDoc(t, "a")})
	picks := picksOf(t, catalog, nil)

	d := Decide(r, Observed{Namespace: wc, Source: src, Picks: picks}, false, now)
	if d.Action != ActionCreate {
		t.Fatalf("decision %+v", d)
	}
	if want := shas("a"); !slices.Equal(sortedSHA256s(readCopy(t, d.Object.Data).Set), want) {
		t.Errorf("created copy holds %v", sortedSHA256s(readCopy(t, d.Object.Data).Set))
	}
	if d.Object.Annotations[AnnotationPicks] == "" || d.Object.Annotations[AnnotationSourceHash] != SourceHash(d.Object) {
		t.Errorf("annotations %v", d.Object.Annotations)
	}
	cp := d.Object
	cp.ResourceVersion, cp.UID = "1", "copy-uid"

	// b changes and d appears: nothing wc1 can pick.
	src2 := configMap("sylva-system", "served", servedData(t, []string{"a", "b", "c", "d"}, nil))
	src2.UID = "source-uid"
	if d := Decide(r, Observed{Namespace: wc, Source: src2, Copy: cp, Picks: picks}, false, now); d.Action != ActionNone || d.State != StateInSync {
		t.Errorf("a change of entries wc1 cannot pick: %+v", d)
	}
	// The catalog picks c too: the copy is updated.
	picks = picksOf(t, configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: catalogDoc(t, "a", "c")}), nil)
	d = Decide(r, Observed{Namespace: wc, Source: src2, Copy: cp, Picks: picks}, false, now)
	if d.Action != ActionUpdate || !slices.Equal(sortedSHA256s(readCopy(t, d.Object.Data).Set), shas("a", "c")) {
		t.Errorf("catalog change: %+v", d)
	}
	// A whole copy of the same source is not in sync with a filtered one:
	// turning the Catalog off rewrites the copy whole, without the note.
	d = Decide(rule, Observed{Namespace: wc, Source: src2, Copy: cp}, false, now)
	if d.Action != ActionUpdate || !maps.Equal(d.Object.Data, src2.Data) || d.Object.Annotations[AnnotationPicks] != "" {
		t.Errorf("whole again: %+v", d)
	}
}

// TestFilteredLargeCatalog: a catalog of thousands of images, most not
// served, gives a copy of the served entries it names, no larger.
func TestFilteredLargeCatalog(t *testing.T) {
	var names []string
	for i := range 6000 {
		names = append(names, fmt.Sprintf("img-%d", i))
	}
	doc := catalogDoc(t, names...)
	if len(doc) < 512<<10 {
		t.Fatalf("catalog of %d bytes, want a large one", len(doc))
	}
	src := ReadServedSource(configMap("sylva-system", "served", servedData(t, []string{"img-1", "img-4000", "not-in-catalog"}, nil)))
	got, _, _, err := src.Filtered("wc1", picksOf(t, configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: doc}), nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := shas("img-1", "img-4000"); !slices.Equal(sortedSHA256s(readCopy(t, got).Set), want) {
		t.Errorf("served set %v", sortedSHA256s(readCopy(t, got).Set))
	}
	size := 0
	for _, v := range got {
		size += len(v)
	}
	if size > 1024 {
		t.Errorf("copy of %d bytes for two entries", size)
	}
}

// TestFilteredCopyIsStable: a copy of many entries, decided again on the
// same source and catalog, is in sync: the filtered document comes out as
// the same bytes each time, so no copy is rewritten at every reconcile.
func TestFilteredCopyIsStable(t *testing.T) {
	r := rule
	r.Catalog = osimage.InfoConfigMapName
	var names []string
	for i := range 200 {
		names = append(names, fmt.Sprintf("image-%d", i))
	}
	src := configMap("sylva-system", "served", servedData(t, names, nil))
	src.UID = "source-uid"
	picks := picksOf(t, configMap("wc1", osimage.InfoConfigMapName, map[string]string{osimage.ValuesKey: catalogDoc(t, names[:100]...)}), nil)
	wc := namespace("wc1", map[string]string{"wc": ""})
	d := Decide(r, Observed{Namespace: wc, Source: src, Picks: picks}, false, now)
	cp := d.Object
	cp.ResourceVersion, cp.UID = "1", "copy-uid"
	for range 20 {
		if d := Decide(r, Observed{Namespace: wc, Source: src, Picks: picks}, false, now); d.Action != ActionCreate {
			t.Fatalf("decision %+v", d)
		}
		if d := Decide(r, Observed{Namespace: wc, Source: src, Copy: cp, Picks: picks}, false, now); d.Action != ActionNone {
			t.Fatalf("an unchanged copy of 100 entries is written again: %s", d.Reason)
		}
	}
}
