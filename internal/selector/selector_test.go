package selector

import (
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

func mustParse(t testing.TB, raw map[string]any) Selector {
	t.Helper()
	s, err := Parse(raw, ".sel")
	if err != nil {
		t.Fatalf("Parse(%v): %v", raw, err)
	}
	return s
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		raw     any
		want    map[string]string // patterns after parsing
		wantErr string            // exact error text when set
		errHas  []string          // substrings of the error when set
	}{
		{name: "nil is the empty selector", raw: nil, want: map[string]string{}},
		{name: "empty map", raw: map[string]any{}, want: map[string]string{}},
		{
			name: "every base key",
			raw: map[string]any{
				"os": "ubuntu", "os-release": "noble", "k8s-flavor": "rke2", "k8s-version": `1\.32.*`,
				"hardened": "false", "commit-tag": "0.7.6", "flavor": "plain",
				"oci-image-registry-key": "sylva", "_os_images_key_": "img-a",
			},
			want: map[string]string{
				"os": "ubuntu", "os-release": "noble", "k8s-flavor": "rke2", "k8s-version": `1\.32.*`,
				"hardened": "false", "commit-tag": "0.7.6", "flavor": "plain",
				"oci-image-registry-key": "sylva", "_os_images_key_": "img-a",
			},
		},
		{name: "booleans become true/false", raw: map[string]any{"hardened": true, "os": false}, want: map[string]string{"hardened": "true", "os": "false"}},
		// Sylva's validate-selector refuses a null pattern; so does a level
		// merge that leaves one (a null does not remove a more general
		// level's pattern there).
		{name: "null value is refused", raw: map[string]any{"os": nil, "flavor": "plain"}, errHas: []string{".sel:", "'os'", "string or a boolean", "null"}},
		{
			name:    "unknown key refused",
			raw:     map[string]any{"os": "ubuntu", "size": "1"},
			wantErr: ".sel: OS selector key 'size': this key is not among the supported base keys (set _use_extra_keys_: true to allow it)",
		},
		{
			name:   "unknown key refused when _use_extra_keys_ is false",
			raw:    map[string]any{"size": "1", "_use_extra_keys_": false},
			errHas: []string{".sel: OS selector key 'size': this key is not among the supported base keys"},
		},
		{
			name: "extra keys allowed by _use_extra_keys_, which is no match key",
			raw:  map[string]any{"size": "1", "commit-id": "abc", "_use_extra_keys_": true},
			want: map[string]string{"size": "1", "commit-id": "abc"},
		},
		{name: "_use_extra_keys_ quoted", raw: map[string]any{"size": "1", "_use_extra_keys_": "true"}, want: map[string]string{"size": "1"}},
		{name: "_use_extra_keys_ null", raw: map[string]any{"os": "x", "_use_extra_keys_": nil}, errHas: []string{"._use_extra_keys_", "null"}},
		{name: "_use_extra_keys_ not a boolean", raw: map[string]any{"_use_extra_keys_": "yes"}, errHas: []string{".sel", "._use_extra_keys_", "true or false"}},
		{name: "not a map", raw: "os=ubuntu", errHas: []string{".sel:", "must be a map"}},
		{name: "list", raw: []any{map[string]any{"os": "x"}}, errHas: []string{".sel:", "a list"}},
		{name: "number value", raw: map[string]any{"os-release": 15.6}, errHas: []string{".sel:", "'os-release'", "string or a boolean", "15.6"}},
		{name: "int value", raw: map[string]any{"os-release": 24}, errHas: []string{".sel:", "'os-release'", "24"}},
		{name: "map value", raw: map[string]any{"os": map[string]any{}}, errHas: []string{".sel:", "'os'", "a map"}},
		{name: "list value", raw: map[string]any{"os": []any{"a"}}, errHas: []string{".sel:", "'os'", "a list"}},
		{name: "bad regexp", raw: map[string]any{"os": "ubuntu("}, errHas: []string{".sel:", "'os'", `"ubuntu("`, "invalid regular expression"}},
		{name: "pattern escaping its anchors", raw: map[string]any{"os": "a)|(b"}, errHas: []string{".sel:", "'os'", `"a)|(b"`}},
		{name: "first bad key in sorted order is reported", raw: map[string]any{"zz": "1", "aa": "1"}, errHas: []string{"'aa'"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse(tt.raw, ".sel")
			if tt.wantErr != "" || tt.errHas != nil {
				if err == nil {
					t.Fatalf("Parse: no error, want one")
				}
				if tt.wantErr != "" && err.Error() != tt.wantErr {
					t.Errorf("error\n got %q\nwant %q", err, tt.wantErr)
				}
				for _, sub := range tt.errHas {
					if !strings.Contains(err.Error(), sub) {
						t.Errorf("error %q lacks %q", err, sub)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := s.Map()
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("key %s: got %q, want %q", k, got[k], v)
				}
			}
			if s.Has(KeyUseExtraKeys) {
				t.Errorf("%s must not be a match key", KeyUseExtraKeys)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	img := osimage.Image{
		"os": "ubuntu", "os-release": "noble", "hardened": "false", "k8s-version": "1.32.5+rke2r1",
		"flavor": "", "size": "22000000000",
	}
	tests := []struct {
		name string
		sel  map[string]any
		key  string
		want bool
	}{
		{name: "empty selector matches anything", sel: map[string]any{}, want: true},
		{name: "literal", sel: map[string]any{"os": "ubuntu"}, want: true},
		{name: "prefix is not enough", sel: map[string]any{"os": "ubu"}, want: false},
		{name: "pattern must cover the whole value", sel: map[string]any{"os": "ubuntu2"}, want: false},
		{name: "regexp", sel: map[string]any{"os": "ub.*"}, want: true},
		{name: "alternation is anchored as a whole", sel: map[string]any{"os": "opensuse|ubuntu"}, want: true},
		{name: "alternation does not leak out of the anchors", sel: map[string]any{"os": "ubun|tu"}, want: false},
		{name: "case sensitive", sel: map[string]any{"os": "Ubuntu"}, want: false},
		{name: "case-insensitive flag", sel: map[string]any{"os": "(?i)UBUNTU"}, want: true},
		{name: "every key must match", sel: map[string]any{"os": "ubuntu", "os-release": "jammy"}, want: false},
		{name: "every key matches", sel: map[string]any{"os": "ubuntu", "os-release": "noble|jammy"}, want: true},
		{name: "boolean pattern", sel: map[string]any{"hardened": false}, want: true},
		{name: "boolean pattern mismatch", sel: map[string]any{"hardened": true}, want: false},
		{name: "missing field is //unset", sel: map[string]any{"commit-tag": "//unset"}, want: true},
		{name: "missing field matches .*", sel: map[string]any{"commit-tag": ".*"}, want: true},
		{name: "missing field does not match the empty pattern", sel: map[string]any{"commit-tag": ""}, want: false},
		{name: "empty field matches the empty pattern", sel: map[string]any{"flavor": ""}, want: true},
		{name: "empty field is not //unset", sel: map[string]any{"flavor": "//unset"}, want: false},
		{name: "missing field does not match a word", sel: map[string]any{"commit-tag": "0.7.6"}, want: false},
		{name: "escaped plus", sel: map[string]any{"k8s-version": `1.32.5\+rke2r1`}, want: true},
		{name: "unescaped plus does not match a plus", sel: map[string]any{"k8s-version": `1.32.5+rke2r1`}, want: false},
		{name: "image key", sel: map[string]any{"_os_images_key_": "ubuntu-noble"}, key: "ubuntu-noble", want: true},
		{name: "image key regexp", sel: map[string]any{"_os_images_key_": "ubuntu-.*"}, key: "ubuntu-noble", want: true},
		{name: "image key mismatch", sel: map[string]any{"_os_images_key_": "ubuntu"}, key: "ubuntu-noble", want: false},
		{name: "extra key", sel: map[string]any{"_use_extra_keys_": true, "size": "22[0-9]+"}, want: true},
		{name: "extra key missing", sel: map[string]any{"_use_extra_keys_": true, "md5": "//unset"}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustParse(t, tt.sel)
			if got, err := s.Matches(tt.key, img); err != nil || got != tt.want {
				t.Errorf("%s.Matches = %v, %v; want %v", s, got, err, tt.want)
			}
		})
	}
}

func TestList(t *testing.T) {
	cat := osimage.Catalog{
		"a": {"os": "ubuntu"},
		"b": {"os": "opensuse"},
		"c": {"os": "leapmicro"},
	}
	l := List{mustParse(t, map[string]any{"os": "ubuntu"}), mustParse(t, map[string]any{"_os_images_key_": "b"})}
	if got, err := l.Select(cat); err != nil || strings.Join(got, ",") != "a,b" {
		t.Errorf("Select = %v, %v; want a,b", got, err)
	}
	if got, err := (List{}).Select(cat); err != nil || len(got) != 0 {
		t.Errorf("an empty list must match nothing: %v, %v", got, err)
	}
	if _, err := l.Select(osimage.Catalog{}); err == nil || !strings.Contains(err.Error(), "os_images is empty") {
		t.Errorf("an empty catalog: %v", err)
	}
}

// A field that a selector reads must be a string or a boolean: anything
// else is an error naming the image and the field, raised only where
// Sylva's selector-matches-os-image raises it (keys in sorted order, the
// first pattern that does not match ends the test). No value is ever
// re-formatted: the number 15.10 is neither "15.10" nor "15.1".
func TestMatchesFieldTypes(t *testing.T) {
	img := osimage.Image{
		"os": "ubuntu", "os-release": 15.1, "hardened": true, "flavor": nil,
		"extra": map[string]any{"a": "b"}, "tags": []any{"x"}, "commit-tag": 7.0,
	}
	tests := []struct {
		name   string
		sel    map[string]any
		want   bool
		errHas []string
	}{
		{name: "a boolean field reads true", sel: map[string]any{"hardened": "true"}, want: true},
		{name: "a boolean field matches a boolean", sel: map[string]any{"hardened": true}, want: true},
		{name: "a boolean field matches a pattern", sel: map[string]any{"hardened": "t.*"}, want: true},
		{name: "a number field is an error", sel: map[string]any{"os-release": `15\.10`}, errHas: []string{"os_images.k.os-release", "the number 15.1", "quote it"}},
		{name: "a number is not read as its decimal form", sel: map[string]any{"os-release": `15\.1`}, errHas: []string{"os_images.k.os-release"}},
		{name: "a null field is an error, even for the empty pattern", sel: map[string]any{"flavor": ""}, errHas: []string{"os_images.k.flavor", "null"}},
		{name: "a map field is an error", sel: map[string]any{"_use_extra_keys_": true, "extra": ".*"}, errHas: []string{"os_images.k.extra", "a map"}},
		{name: "a list field is an error", sel: map[string]any{"_use_extra_keys_": true, "tags": ".*"}, errHas: []string{"os_images.k.tags", "a list"}},
		{name: "a field no key reads is not checked", sel: map[string]any{"os": "ubuntu"}, want: true},
		// commit-tag < os < os-release: os rules the image out before
		// os-release is read; commit-tag is read first and fails.
		{name: "ruled out by an earlier key: not checked", sel: map[string]any{"os": "debian", "os-release": ".*"}, want: false},
		{name: "read after earlier keys match: checked", sel: map[string]any{"os": "ubuntu", "os-release": ".*"}, errHas: []string{"os_images.k.os-release"}},
		{name: "read before the key that rules it out: checked", sel: map[string]any{"commit-tag": ".*", "os": "debian"}, errHas: []string{"os_images.k.commit-tag", "the number 7"}},
		{name: "a literal later in order does not hide the error", sel: map[string]any{"_use_extra_keys_": true, "extra": ".*", "os": "debian"}, errHas: []string{"os_images.k.extra"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustParse(t, tt.sel)
			got, err := s.Matches("k", img)
			if tt.errHas != nil {
				if err == nil {
					t.Fatalf("Matches = %v, want an error", got)
				}
				for _, sub := range tt.errHas {
					if !strings.Contains(err.Error(), sub) {
						t.Errorf("error %q lacks %q", err, sub)
					}
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Matches = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// A null os_images entry is an error naming it as soon as any selector
// runs over the catalog, as in Sylva; the same catalog still serves an
// image_key lookup of another image.
func TestNullImageEntry(t *testing.T) {
	cat := osimage.Catalog{"a": {"os": "ubuntu"}, "gone": nil}
	for _, sel := range []map[string]any{{"os": "//unset"}, {"os": "ubuntu"}, {}} {
		if _, err := mustParse(t, sel).Select(cat); err == nil || !strings.Contains(err.Error(), "os_images.gone") || !strings.Contains(err.Error(), "null") {
			t.Errorf("%v: %v, want an error naming os_images.gone", sel, err)
		}
	}
	if key, err := Resolve(cat, "a", nil, ".ctx"); err != nil || key != "a" {
		t.Errorf("image_key lookup: %q, %v", key, err)
	}
}

func TestString(t *testing.T) {
	s := mustParse(t, map[string]any{"os": "ubuntu", "hardened": false, "k8s-version": `1.32\+x`})
	if got, want := s.String(), `{hardened: false, k8s-version: 1.32\+x, os: ubuntu}`; got != want {
		t.Errorf("String = %s, want %s", got, want)
	}
	if !s.Has("k8s-version") || s.Has("flavor") {
		t.Error("Has")
	}
}
