package osimage

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// The path ImagePath builds reaches an HTTP server as one segment that
// ParseImagePath reads back into the same image and filename, checksum
// files included, whatever the filename holds that a URL must escape.
func TestImagePathSurvivesHTTP(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.EscapedPath()
	}))
	defer srv.Close()
	sha := SHA256(strings.Repeat("0123456789abcdef", 4))
	for _, name := range []string{"ubuntu.raw", "a b#1.raw", "100%.raw", "what?.qcow2", "é+;=&.raw", "a%2Fb.raw", strings.Repeat("x", 255)} {
		if err := ValidateFilename(name); err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		for _, suffix := range []string{"", SHA256SumSuffix, MD5SumSuffix} {
			resp, err := http.Get(srv.URL + ImagePath(sha, name) + suffix)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			escaped := <-got
			f, ok := ParseImagePath(escaped)
			if !ok || f.SHA256 != sha || f.Filename != name || f.Checksum != suffix || f.Name() != name+suffix {
				t.Errorf("%q%s arrived as %s, parsed as %+v %v", name, suffix, escaped, f, ok)
			}
		}
	}
}

// ParseImagePath refuses every path ImagePath cannot have built.
func TestParseImagePathRefuses(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	for _, p := range []string{
		"/images/" + sha,
		"/images/" + sha + "/",
		"/images/" + sha + "/a/b.raw",
		"/images/" + sha + "/a%2Fb.raw",
		"/images/" + sha + "/a%5Cb.raw",
		"/images/" + strings.ToUpper(sha) + "/a.raw",
		"/images/" + sha[:62] + "/a.raw",
		"/images//a.raw",
		"/images/" + sha + "/" + SHA256SumSuffix,
		"/images/" + sha + "/a.raw" + MD5SumSuffix + SHA256SumSuffix,
		"/images/" + sha + "/%2e%2e",
		"/images/" + sha + "/.hidden",
		"/images/" + sha + "/a%00b.raw",
		"/images/" + sha + "/a%0Ab.raw",
		"/images/" + sha + "/a%zz.raw",
		"/images/" + sha + "/a%ff.raw",
		"/image/" + sha + "/a.raw",
		"images/" + sha + "/a.raw",
		"/images/" + sha + "/" + strings.Repeat("x", 256),
	} {
		if f, ok := ParseImagePath(p); ok {
			t.Errorf("%s parsed as %+v", p, f)
		}
	}
}

// Serves tells a filename served, one not served, and an image the
// document says nothing of (published by a server without filenames),
// which nobody can tell; the document round-trips and is strict.
func TestServedFilenames(t *testing.T) {
	a, b := SHA256(strings.Repeat("a", 64)), SHA256(strings.Repeat("b", 64))
	files := ServedFilenames{a: {"a.raw", "a2.raw"}, b: {}}
	for _, tc := range []struct {
		sha           SHA256
		name          string
		served, known bool
	}{{a, "a2.raw", true, true}, {a, "b.raw", false, true}, {b, "a.raw", false, true}, {SHA256(strings.Repeat("c", 64)), "a.raw", false, false}} {
		if served, known := files.Serves(tc.sha, tc.name); served != tc.served || known != tc.known {
			t.Errorf("%s/%s: served %v known %v", tc.sha[:4], tc.name, served, known)
		}
	}
	doc, err := MarshalServedFilenames(files)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseServedFilenames(doc)
	if err != nil || len(back) != 2 || strings.Join(back[a], ",") != "a.raw,a2.raw" || len(back[b]) != 0 {
		t.Errorf("round trip of\n%s: %v %v", doc, back, err)
	}
	if doc, _ := MarshalServedFilenames(nil); string(doc) != "served_filenames: {}\n" {
		t.Errorf("no filenames: %q", doc)
	}
	for _, bad := range []string{"served_filenames: {}\nextra: 1\n", "served_filenames: [a]\n", "served_filenames:\n  " + string(a) + ": a.raw\n"} {
		if _, err := ParseServedFilenames([]byte(bad)); err == nil || !strings.Contains(err.Error(), "served_filenames") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// The served-images ConfigMap holds values.yaml, served-filenames.yaml and
// served-oci.yaml, each readable by its parser, and refused-needs.yaml only
// when some need is refused; an output over a ConfigMap's size is refused,
// named.
func TestServedOutputConfigMapData(t *testing.T) {
	a := SHA256(strings.Repeat("a", 64))
	ref := OCIServed{Repository: OCIRepository(a), Manifest: digest.Digest("sha256:" + strings.Repeat("b", 64))}
	out := ServedOutput{Set: ServedSet{a: {Available: true, ImageKey: "ubuntu"}}, Filenames: ServedFilenames{a: {"u.raw"}}, OCI: ServedOCI{a: ref}}
	data, err := out.ConfigMapData("ConfigMap ns/served")
	if err != nil || len(data) != 3 {
		t.Fatalf("%v %v: want values.yaml, served-filenames.yaml and served-oci.yaml", data, err)
	}
	if oci, err := ParseServedOCI([]byte(data[ServedOCIKey])); err != nil || oci[a] != ref {
		t.Errorf("served-oci.yaml %q: %v %v", data[ServedOCIKey], oci, err)
	}
	if _, err := ParseServedOCI([]byte("served_oci: {}\nother: 1\n")); err == nil || !strings.Contains(err.Error(), "served_oci") {
		t.Errorf("an unknown field must be refused, named: %v", err)
	}
	set, err := ParseServed([]byte(data[ValuesKey]))
	if err != nil || set[a] != out.Set[a] {
		t.Errorf("values.yaml %q: %v %v", data[ValuesKey], set, err)
	}
	files, err := ParseServedFilenames([]byte(data[ServedFilenamesKey]))
	if err != nil || files[a][0] != "u.raw" {
		t.Errorf("served-filenames.yaml %q: %v %v", data[ServedFilenamesKey], files, err)
	}

	out.Refused = RefusedNeeds{{SHA256: a, Namespace: "t1", Reason: RefusedBytes, Message: "over 10 GiB"}}
	data, err = out.ConfigMapData("ConfigMap ns/served")
	if err != nil {
		t.Fatal(err)
	}
	refused, err := ParseRefusedNeeds([]byte(data[RefusedNeedsKey]))
	if err != nil || len(refused) != 1 || refused[0] != out.Refused[0] {
		t.Errorf("refused-needs.yaml %q: %+v %v", data[RefusedNeedsKey], refused, err)
	}

	big := ServedOutput{Set: ServedSet{}, Filenames: ServedFilenames{}}
	for i := range 6000 {
		sha := SHA256(fmt.Sprintf("%064x", i))
		big.Set[sha] = ServedImage{Available: true, ImageKey: fmt.Sprintf("image-%d", i)}
		big.Filenames[sha] = []string{strings.Repeat("f", 100) + ".raw"}
	}
	var size *SizeError
	if _, err := big.ConfigMapData("ConfigMap ns/served"); !errors.As(err, &size) || size.Images != 6000 || size.What != "ConfigMap ns/served" {
		t.Errorf("6000 images: %v", err)
	}
}

// Equal compares all that is published: the set, the filenames in their
// order, and the refusals.
func TestServedOutputEqual(t *testing.T) {
	a := SHA256(strings.Repeat("a", 64))
	base := func() ServedOutput {
		return ServedOutput{
			Set:       ServedSet{a: {Available: true, ImageKey: "k"}},
			Filenames: ServedFilenames{a: {"x.raw", "y.raw"}},
			Refused:   RefusedNeeds{{SHA256: a, Namespace: "t", Reason: RefusedStorage}},
		}
	}
	if !base().Equal(base()) {
		t.Fatal("an output differs from itself")
	}
	for name, change := range map[string]func(*ServedOutput){
		"availability":   func(o *ServedOutput) { o.Set[a] = ServedImage{ImageKey: "k"} },
		"filename order": func(o *ServedOutput) { o.Filenames[a] = []string{"y.raw", "x.raw"} },
		"no filenames":   func(o *ServedOutput) { o.Filenames = nil },
		"refusal reason": func(o *ServedOutput) { o.Refused[0].Reason = RefusedBytes },
		"no refusal":     func(o *ServedOutput) { o.Refused = nil },
	} {
		o := base()
		change(&o)
		if o.Equal(base()) || base().Equal(o) {
			t.Errorf("a change of %s is not seen", name)
		}
	}
}

// For gives a namespace its own refusal of an image before one of all its
// needs, and nothing of another namespace's; Sort orders by namespace,
// then sha256; no refusal marshals as an empty list.
func TestRefusedNeedsForAndSort(t *testing.T) {
	a, b := SHA256(strings.Repeat("a", 64)), SHA256(strings.Repeat("b", 64))
	r := RefusedNeeds{
		{SHA256: b, Namespace: "t2", Reason: RefusedImages},
		{SHA256: "", Namespace: "t1", Reason: RefusedDocumentShare},
		{SHA256: b, Namespace: "t1", Reason: RefusedURI},
		{SHA256: a, Namespace: "t2", Reason: RefusedNoRecord},
	}
	for _, tc := range []struct {
		ns     string
		sha    SHA256
		reason string
	}{{"t1", b, RefusedURI}, {"t1", a, RefusedDocumentShare}, {"t2", a, RefusedNoRecord}, {"t2", SHA256(strings.Repeat("c", 64)), ""}, {"t3", a, ""}} {
		got, ok := r.For(tc.ns, tc.sha)
		if ok != (tc.reason != "") || got.Reason != tc.reason {
			t.Errorf("%s %s: %+v %v, want %q", tc.ns, tc.sha[:4], got, ok, tc.reason)
		}
	}
	r.Sort()
	var order []string
	for _, n := range r {
		order = append(order, n.Namespace+"/"+n.Reason)
	}
	if strings.Join(order, " ") != "t1/document-share t1/uri-not-allowed t2/no-record t2/quota-images" {
		t.Errorf("sorted: %v", order)
	}
	if doc, _ := MarshalRefusedNeeds(nil); string(doc) != "refused_needs: []\n" {
		t.Errorf("no refusal: %q", doc)
	}
	if _, err := ParseRefusedNeeds([]byte("refused_needs:\n- {sha256: '', namespace: a, why: x}\n")); err == nil {
		t.Error("a refusal with an unknown field is accepted")
	}
}

// Require gives contract §9's texts: not served, served but not available
// yet, and nothing for an available image.
func TestServedSetRequire(t *testing.T) {
	a, b := SHA256(strings.Repeat("a", 64)), SHA256(strings.Repeat("b", 64))
	s := ServedSet{a: {Available: true, ImageKey: "ubuntu"}, b: {ImageKey: "rocky"}}
	if err := s.Require(a, "ubuntu"); err != nil {
		t.Error(err)
	}
	if err := s.Require(b, "rocky"); err == nil || !strings.Contains(err.Error(), "image "+string(b)+"/rocky is known to the mgmt cluster os-image-server but not available yet") {
		t.Errorf("unavailable: %v", err)
	}
	c := SHA256(strings.Repeat("c", 64))
	if err := s.Require(c, "other"); err == nil || err.Error() != "image "+string(c)+"/other is currently not served by mgmt cluster os-image-server" {
		t.Errorf("not served: %v", err)
	}
}

// ServedAt reports every fault of an image at once, each naming the
// image, and gives the sha256 and filename of a good one.
func TestServedAtReportsEveryFault(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	if s, name, err := (Image{FieldSHA256: sha, FieldFilename: "u.raw"}).ServedAt("os_images.u"); err != nil || string(s) != sha || name != "u.raw" {
		t.Errorf("a good image: %q %q %v", s, name, err)
	}
	for _, tc := range []struct {
		img  Image
		want []string
	}{
		{Image{}, []string{"os_images.x has no sha256", "os_images.x has no filename"}},
		{Image{FieldSHA256: strings.ToUpper(sha), FieldFilename: "../x"}, []string{"os_images.x: ", "lowercase", `"/"`}},
		{Image{FieldSHA256: 42, FieldFilename: []any{"a"}}, []string{"os_images.x: ", "sha256", "filename"}},
		{Image{FieldSHA256: sha, FieldFilename: "x.raw.md5sum"}, []string{"os_images.x: ", "suffixes of the checksum files"}},
	} {
		s, name, err := tc.img.ServedAt("os_images.x")
		if err == nil || s != "" || name != "" {
			t.Errorf("%v: %q %q %v", tc.img, s, name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %q lacks %q", tc.img, err, w)
			}
		}
	}
}

// ReadValuesDocument names the file in its errors: one missing, one that
// is not YAML, a ConfigMap without values.yaml.
func TestReadValuesDocumentNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("cm.yaml", "kind: ConfigMap\ndata:\n  values.yaml: 'os_images: {}'\n")
	if doc, err := ReadValuesDocument(good); err != nil || string(doc) != "os_images: {}" {
		t.Errorf("%q %v", doc, err)
	}
	for _, p := range []string{filepath.Join(dir, "missing.yaml"), write("tabs.yaml", "a:\n\t- b: [\n"), write("other.yaml", "kind: ConfigMap\ndata: {x: y}\n")} {
		if _, err := ReadValuesDocument(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v", p, err)
		}
	}
	if _, err := ReadValuesDocument(dir); err == nil {
		t.Error("a directory read as a document")
	}
}
