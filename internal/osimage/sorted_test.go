package osimage

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestMarshalIsDeterministic: the same set, catalog or filenames give the
// same bytes at every call, keys in byte order, and read back equal. yaml's
// own key order is not an order on sha256s, and gave a new document at
// almost every call from about 20 entries.
func TestMarshalIsDeterministic(t *testing.T) {
	set, files, oci := ServedSet{}, ServedFilenames{}, ServedOCI{}
	for i := range 200 {
		h := sha256.Sum256([]byte(fmt.Sprint(i)))
		sha, err := ParseSHA256(hex.EncodeToString(h[:]))
		if err != nil {
			t.Fatal(err)
		}
		set[sha] = ServedImage{Available: i%2 == 0, ImageKey: fmt.Sprintf("image-%d", i)}
		files[sha] = []string{fmt.Sprintf("image-%d.raw", i)}
		oci[sha] = OCIServed{Repository: OCIRepository(sha), Manifest: OCILayerDigest(sha)}
	}
	// Keys on which yaml's order goes round in a circle, and values it
	// writes as block scalars or quotes.
	cat := Catalog{"a10b": {"sha256": "x"}, "a1b": {"description": "two\n\nlines\n"}, "a9c": {"size": "10"}, "123": {"uri": " spaced "}, "empty": nil}
	for i := range 50 {
		cat[fmt.Sprintf("img%dx%d", i%7, i)] = Image{"sha256": fmt.Sprint(i)}
	}
	docs := map[string]func() ([]byte, error){
		"served set": func() ([]byte, error) { return MarshalServed(set) },
		"filenames":  func() ([]byte, error) { return MarshalServedFilenames(files) },
		"oci":        func() ([]byte, error) { return MarshalServedOCI(oci) },
		"catalog":    func() ([]byte, error) { return MarshalInfo(cat) },
	}
	for name, marshal := range docs {
		first, err := marshal()
		if err != nil {
			t.Fatal(err)
		}
		for range 30 {
			if again, _ := marshal(); string(again) != string(first) {
				t.Fatalf("%s: two calls, two documents", name)
			}
		}
	}

	doc, _ := MarshalServed(set)
	back, err := ParseServed(doc)
	if err != nil || !maps.Equal(back, set) {
		t.Errorf("served set read back: %v (%d of %d entries)", err, len(back), len(set))
	}
	var keys []string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") {
			keys = append(keys, strings.Trim(line, ` ":`))
		}
	}
	if !slices.IsSorted(keys) || len(keys) != len(set) {
		t.Errorf("%d keys, sorted: %v", len(keys), slices.IsSorted(keys))
	}
	doc, _ = MarshalServedFilenames(files)
	if back, err := ParseServedFilenames(doc); err != nil || !maps.EqualFunc(back, files, slices.Equal) {
		t.Errorf("filenames read back: %v", err)
	}
	doc, _ = MarshalInfo(cat)
	back2, err := ParseInfo(doc)
	if err != nil || len(back2) != len(cat) || back2["a1b"]["description"] != "two\n\nlines\n" || back2["123"]["uri"] != " spaced " || back2["empty"] != nil {
		t.Errorf("catalog read back: %v %v\n%s", err, back2, doc)
	}
	for _, empty := range []func() ([]byte, error){
		func() ([]byte, error) { return MarshalServed(nil) },
		func() ([]byte, error) { return MarshalInfo(Catalog{}) },
	} {
		if doc, _ := empty(); !strings.HasSuffix(string(doc), ": {}\n") {
			t.Errorf("empty document %q", doc)
		}
	}
}
