package values

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// NearMiss is a key that a values map lacks while it holds a key that looks
// like a typo of it. Values files carry hundreds of keys that osimages does
// not read, and those are ignored; but a near-miss of a key it reads means
// that key's value is silently lost (os_image: for os_images: serves
// nothing), so it is refused with a hint.
type NearMiss struct {
	// Path locates the map ("" at the top level).
	Path string
	// Found is the key present, Want the key osimages reads.
	Found, Want string
}

func (e *NearMiss) Error() string {
	return fmt.Sprintf("%s: did you mean %s? %s is a key osimages reads and it is absent, so this looks like a typo that would silently drop its value; rename the key (or, if both are meant, set %s too, even empty)",
		join(e.Path, e.Found), e.Want, join(e.Path, e.Want), e.Want)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// NearMisses reports, for each key of want that m lacks, the keys of m that
// look like a typo of it: the same letters in another case, with other
// separators (os-images, osImages, cosign_public_key) or in the singular
// (os_images_oci_registry), or, for keys long
// enough to tell, one edit away (os_image, os_imagez), two for long ones
// (os_image_server_aditional_selector). Short keys (capm3, url) only match
// by case and separators, so that capo or capd never read as capm3. path
// locates m in the messages.
func NearMisses(m Values, path string, want ...string) []error {
	var errs []error
	for _, w := range want {
		if _, ok := m[w]; ok {
			continue
		}
		nw := normalizeKey(w)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if slices.Contains(want, k) {
				continue
			}
			if nk := normalizeKey(k); singular(nk) == singular(nw) || editDistance(nk, nw) <= tolerance(nw) {
				errs = append(errs, &NearMiss{Path: path, Found: k, Want: w})
			}
		}
	}
	return errs
}

func normalizeKey(k string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '_', '-', '.', ' ':
			return -1
		}
		return r
	}, strings.ToLower(k))
}

// singular drops an English plural ending, so that a singular typed for a
// plural (os_images_oci_registry) reads as the same key.
func singular(k string) string {
	if s, ok := strings.CutSuffix(k, "ies"); ok {
		return s + "y"
	}
	return strings.TrimSuffix(k, "s")
}

// tolerance is how many edits still read as a typo of a key of this length.
func tolerance(normalized string) int {
	switch n := len(normalized); {
	case n < 6:
		return 0
	case n < 16:
		return 1
	default:
		return 2
	}
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and transpositions of adjacent bytes.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
