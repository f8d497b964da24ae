package osimage

import (
	"fmt"
	"strings"
	"testing"
)

func TestFieldsFromAnnotations(t *testing.T) {
	got := FieldsFromAnnotations(map[string]string{
		"sylvaproject.org/diskimage/sha256":      "abc",
		"sylvaproject.org/diskimage/k8s-version": "1.32.5+rke2r1",
		"org.opencontainers.image.created":       "2026-01-01T00:00:00Z",
		"example.org/sylva-extra/flavor-note":    "kept: key contains sylva",
		"sylva-but-no-slash":                     "named by the whole key",
	})
	want := Image{"sha256": "abc", "k8s-version": "1.32.5+rke2r1", "flavor-note": "kept: key contains sylva", "sylva-but-no-slash": "named by the whole key"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestInfoRoundTrip(t *testing.T) {
	c := Catalog{"b-image": {"sha256": "x", "size": "12"}, "a-image": {"uri": "oci://r/a:1"}}
	doc, err := MarshalInfo(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(doc), "os_images:\n  a-image:") {
		t.Errorf("keys not sorted:\n%s", doc)
	}
	back, err := ParseInfo(doc)
	if err != nil || back["b-image"]["size"] != "12" || back["a-image"]["uri"] != "oci://r/a:1" {
		t.Errorf("round trip: %v %v", back, err)
	}
	// Hand-written documents leave numbers and booleans unquoted, hold
	// maps and nulls: every value is kept as YAML gives it, never turned
	// into another (15.10 is not made "15.1"); readers check the types of
	// the fields they read.
	loose, err := ParseInfo([]byte("os_images:\n  x: {size: 22000000000, hardened: true, os-release: 15.10, labels: [a], extra: {a: b}, gone: null}\n  gone-entry: ~\n"))
	if err != nil {
		t.Fatal(err)
	}
	x := loose["x"]
	if x["size"] != float64(22000000000) || x["hardened"] != true || x["os-release"] != 15.1 || x["gone"] != nil || len(x) != 6 {
		t.Errorf("loose fields: %v", x)
	}
	if y, ok := loose["gone-entry"]; !ok || y != nil {
		t.Errorf("a null entry is kept as a nil Image: %v %v", y, ok)
	}
	if _, err := x.StringField("size"); err == nil || !strings.Contains(err.Error(), "size") || !strings.Contains(err.Error(), "the number 22000000000") {
		t.Errorf("StringField of a number: %v", err)
	}
	if x.Get("size") != "" || x.Get("hardened") != "" {
		t.Error("Get returns only strings")
	}
	for _, doc := range []string{"os_images: [a]\n", "os_images:\n  x: just-a-string\n"} {
		if _, err := ParseInfo([]byte(doc)); err == nil || !strings.Contains(err.Error(), "os_images") {
			t.Errorf("%q: %v", doc, err)
		}
	}
}

func TestServedIsStrict(t *testing.T) {
	abc := strings.Repeat("abc", 21) + "a"
	s, err := ParseServed([]byte("capm3_os_image_server_images:\n  " + abc + ": {available: true, image_key: k}\n"))
	if err != nil || !s[SHA256(abc)].Available || s[SHA256(abc)].ImageKey != "k" {
		t.Fatalf("%v %v", s, err)
	}
	if _, err := ParseServed([]byte("capm3_os_image_server_images:\n  " + abc + ": {available: true, image_key: k, url: x}\n")); err == nil {
		t.Error("an entry with a third field is accepted; the consumer's schema refuses it")
	}
	doc, _ := MarshalServed(ServedSet{SHA256(abc): {Available: false, ImageKey: "k"}})
	if string(doc) != "capm3_os_image_server_images:\n  "+abc+":\n    available: false\n    image_key: k\n" {
		t.Errorf("served document:\n%s", doc)
	}
}

// The documents are where a sha256 enters: each key or field that becomes
// a SHA256 is parsed there, and one that is not a sha256 is left out (no
// image can be looked up under it), the rest read as written.
func TestDocumentsParseTheirSHA256s(t *testing.T) {
	good := strings.Repeat("ab", 32)
	bad := []string{"abc", strings.ToUpper(good), good + "0"}
	var served, files, refused strings.Builder
	served.WriteString("capm3_os_image_server_images:\n  " + good + ": {available: true, image_key: k}\n")
	files.WriteString("served_filenames:\n  " + good + ": [a.raw]\n")
	refused.WriteString("refused_needs:\n- {sha256: " + good + ", namespace: a, reason: storage, message: m}\n- {sha256: '', namespace: b, reason: document-share, message: m}\n")
	for _, b := range bad {
		served.WriteString("  " + b + ": {available: true, image_key: k}\n")
		files.WriteString("  " + b + ": [a.raw]\n")
		refused.WriteString("- {sha256: " + b + ", namespace: c, reason: storage, message: m}\n")
	}
	s, err := ParseServed([]byte(served.String()))
	if err != nil || len(s) != 1 || !s[SHA256(good)].Available {
		t.Errorf("served set: %v %v", s, err)
	}
	f, err := ParseServedFilenames([]byte(files.String()))
	if err != nil || len(f) != 1 || len(f[SHA256(good)]) != 1 {
		t.Errorf("served filenames: %v %v", f, err)
	}
	r, err := ParseRefusedNeeds([]byte(refused.String()))
	if err != nil || len(r) != 2 || r[0].SHA256 != SHA256(good) || r[1].SHA256 != "" {
		t.Errorf("refused needs: %+v %v", r, err)
	}
	needs, dropped, err := ParseFleetNeeds("images: []\nrefused:\n" + strings.TrimPrefix(refused.String(), "refused_needs:\n"))
	if err != nil || len(needs.Refused) != 2 || len(dropped) != len(bad) || !strings.Contains(dropped[0].Error(), "namespace c") {
		t.Errorf("refusals of the fleet's needs: %+v, dropped %v, %v", needs.Refused, dropped, err)
	}
}

func TestValuesDocument(t *testing.T) {
	plain := []byte("os_images: {}\n")
	if doc, err := ValuesDocument(plain); err != nil || string(doc) != string(plain) {
		t.Errorf("plain document: %q %v", doc, err)
	}
	cm := []byte("apiVersion: v1\nkind: ConfigMap\ndata:\n  values.yaml: |\n    os_images: {a: {}}\n")
	if doc, err := ValuesDocument(cm); err != nil || string(doc) != "os_images: {a: {}}\n" {
		t.Errorf("ConfigMap: %q %v", doc, err)
	}
	if _, err := ValuesDocument([]byte("kind: ConfigMap\ndata: {other: x}\n")); err == nil || !strings.Contains(err.Error(), "values.yaml") {
		t.Errorf("ConfigMap without values.yaml: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, k := range []string{"ubuntu-noble", "a1b"} {
		if ValidateKey(k) != nil {
			t.Errorf("key %q refused", k)
		}
	}
	for _, k := range []string{"Bad_Key", "ab", "-abc", "abc-", strings.Repeat("a", 54)} {
		if ValidateKey(k) == nil {
			t.Errorf("key %q accepted", k)
		}
	}
	if _, err := ParseSHA256(strings.Repeat("a", 64)); err != nil {
		t.Error(err)
	}
	if ValidateMD5(strings.Repeat("0", 31)) == nil || ValidateMD5(strings.Repeat("0", 32)) != nil {
		t.Error("md5 validation")
	}
}

// (A) is os-images-info's os_images with the cluster values' own merged on
// top, as Flux merges valuesFrom and inline values: image by image, field
// by field, maps merged, anything else (a null included) replacing.
func TestMergeA(t *testing.T) {
	info := Catalog{
		"a":    {"sha256": "aaa", "filename": "a.raw", "os": "ubuntu", "labels": map[string]any{"x": "1", "y": "2"}},
		"b":    {"sha256": "bbb", "filename": "b.raw"},
		"gone": {"sha256": "ggg"},
	}
	values := map[string]any{"os_images": map[string]any{
		"a":    map[string]any{"filename": "renamed.raw", "os": nil, "labels": map[string]any{"y": "3"}},
		"c":    map[string]any{"sha256": "ccc"},
		"gone": nil,
	}}
	got, err := MergeA(info, values)
	if err != nil {
		t.Fatal(err)
	}
	a := got["a"]
	if a["sha256"] != "aaa" || a["filename"] != "renamed.raw" || a["os"] != nil || len(a) != 4 {
		t.Errorf("a, merged field by field: %v", a)
	}
	if labels := a["labels"].(map[string]any); labels["x"] != "1" || labels["y"] != "3" {
		t.Errorf("a map field merges key by key: %v", labels)
	}
	if _, ok := a["os"]; !ok {
		t.Error("a null field is kept as a value (a selector that reads it fails, as in Sylva)")
	}
	if got["b"]["sha256"] != "bbb" || got["c"]["sha256"] != "ccc" {
		t.Errorf("images of one side only: %v", got)
	}
	if g, ok := got["gone"]; !ok || g != nil {
		t.Errorf("a null image replaces the image: %v", g)
	}
	if info["a"]["filename"] != "a.raw" || info["a"]["labels"].(map[string]any)["y"] != "2" {
		t.Errorf("MergeA changed its input: %v", info["a"])
	}

	if got, err := MergeA(info, map[string]any{}); err != nil || len(got) != 3 || got["a"]["filename"] != "a.raw" {
		t.Errorf("no os_images in the values: %v %v", got, err)
	}
	if got, err := MergeA(nil, map[string]any{}); err != nil || got != nil {
		t.Errorf("no catalog at all is nil: %v %v", got, err)
	}
	if got, err := MergeA(nil, values); err != nil || len(got) != 3 {
		t.Errorf("the values' own os_images alone: %v %v", got, err)
	}
	for _, bad := range []any{"x", []any{}, nil, map[string]any{"a": "x"}} {
		if _, err := MergeA(info, map[string]any{"os_images": bad}); err == nil || !strings.Contains(err.Error(), ".os_images") {
			t.Errorf("os_images %v: %v", bad, err)
		}
	}
}

func TestRefusedNeedsBoundedKeepsOnePerNamespace(t *testing.T) {
	var all RefusedNeeds
	long := strings.Repeat("m", 1000)
	for i := range 50 {
		all = append(all, RefusedNeed{Namespace: "noisy", SHA256: SHA256(fmt.Sprintf("%064d", i)), Reason: RefusedImages, Message: long})
	}
	all = append(all, RefusedNeed{Namespace: "quiet", Reason: RefusedImages, Message: "one"})
	if got := all.Bounded(1 << 20); len(got) != len(all) || got[len(got)-1].Namespace != "quiet" {
		t.Fatalf("under the bound: %d refusals, last %s; want all, sorted", len(got), got[len(got)-1].Namespace)
	}
	got := all.Bounded(5000)
	ns := map[string]int{}
	for _, r := range got {
		ns[r.Namespace]++
	}
	if ns["quiet"] != 1 || ns["noisy"] < 1 || ns["noisy"] > 4 {
		t.Errorf("bounded to 5000 bytes: %v; want quiet's one refusal kept, noisy's cut to what fits", ns)
	}
}
