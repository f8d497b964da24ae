package selector

import (
	"regexp"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// FuzzSelector feeds arbitrary keys, patterns, field values and cluster
// values through Parse, Finalize, Matches, Pick and Resolve. Besides not
// panicking, a parsed selector must agree with the plain definition of a
// match, `^(pattern)$` against the field or //unset, which checks the
// literal fast path and the anchoring.
func FuzzSelector(f *testing.F) {
	f.Add("os", "ubuntu", "ubuntu", "k8s-version", `1.32.5\+rke2r1`, "1.32.5+rke2r1", false, "v1.32.5+rke2r1", "cabpr", "")
	f.Add("size", "22.*", "22000", "os", "(?i)UBU", "ubuntu", true, "v1.31.4", "cabpk", "sylva|x")
	f.Add("_os_images_key_", "img-.*", "", "hardened", "//unset", "", false, "", "", "[")
	f.Add("os", "a)|(b", "a", "flavor", "", "", true, "v1(", "cabpx", ".*")
	f.Add("commit-tag", `\Q.*\E`, ".*", "os", "x{2,3}", "xx", true, "vv", "cabpoa", "")
	f.Fuzz(func(t *testing.T, k1, p1, v1, k2, p2, v2 string, extra bool, k8s, bootstrap, regs string) {
		raw := map[string]any{k1: p1, k2: p2}
		if extra {
			raw[KeyUseExtraKeys] = true
		}
		img := osimage.Image{}
		if v1 != "" {
			img[k1] = v1
		}
		if v2 != "" {
			img[k2] = v2
		}
		const key = "the-image"
		cat := osimage.Catalog{key: img, "other": {k1: v2, k2: v1}}

		sel, err := Parse(raw, ".fuzz")
		if err != nil {
			return
		}
		got, err := sel.Matches(key, img)
		if err != nil {
			t.Fatalf("%s.Matches(%q): %v (every field is a string)", sel, img, err)
		}
		want := true
		for k, p := range sel.Map() {
			v := Unset
			if k == KeyImageKey {
				v = key
			} else if f, ok := img[k]; ok {
				v = f.(string)
			}
			if !regexp.MustCompile("^(" + p + ")$").MatchString(v) {
				want = false
			}
		}
		if got != want {
			t.Fatalf("%s.Matches(%q) = %v, the regexps say %v", sel, img, got, want)
		}
		_, _ = Pick(sel, cat, ".fuzz")
		_, _ = List{sel, {}}.Select(cat)
		_, _ = Resolve(cat, k1, &sel, ".fuzz")
		fin, err := Finalize(sel, Cluster{K8sVersion: k8s, BootstrapProvider: bootstrap, AutoselectRegistries: regs})
		if err != nil {
			return
		}
		for _, k := range []string{osimage.FieldK8sVersion, osimage.FieldK8sFlavor, osimage.FieldRegistryKey} {
			if !fin.Has(k) {
				t.Fatalf("finalized %s lacks %s", fin, k)
			}
		}
		_, _ = Pick(fin, cat, ".fuzz")
	})
}
