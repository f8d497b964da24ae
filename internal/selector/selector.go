// Package selector implements the OS image selectors of contract §4:
// parsing and validating them, matching them against image records,
// finalizing them for a cluster and picking the one image they designate.
package selector

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// Keys with a meaning of their own in a selector.
const (
	// KeyImageKey matches the image's key in os_images rather than a field.
	KeyImageKey = "_os_images_key_"
	// KeyUseExtraKeys, when true, lets a selector name fields outside the
	// base keys. It is an option, not a match key.
	KeyUseExtraKeys = "_use_extra_keys_"
	// Unset is what a pattern is matched against when the image lacks the
	// field. It cannot be a real field value by accident, so only a pattern
	// written for it (or one like ".*") matches a missing field.
	Unset = "//unset"
)

// baseKeys are the keys a selector may hold without _use_extra_keys_.
var baseKeys = map[string]bool{
	osimage.FieldOS:          true,
	osimage.FieldOSRelease:   true,
	osimage.FieldK8sFlavor:   true,
	osimage.FieldK8sVersion:  true,
	osimage.FieldHardened:    true,
	osimage.FieldCommitTag:   true,
	osimage.FieldFlavor:      true,
	osimage.FieldRegistryKey: true,
	KeyImageKey:              true,
}

// Selector is a validated selector: image field -> pattern. The zero value
// is the empty selector, which matches every image.
type Selector struct {
	terms []term // sorted by key, one per key
}

type term struct {
	key     string
	pattern string
	*compiled
}

// Parse validates raw, a selector as YAML decoding gives it (a map of key ->
// string or boolean), and compiles its patterns. A nil raw is the empty
// selector, which matches every image, as Sylva's select-os-images has it.
// A null pattern is refused, as Sylva refuses it: a null that a more
// specific level of values wrote over a more general one's pattern does not
// remove it (see capm3 for when a whole os_image_selector is unset).
// path names the selector in error messages.
func Parse(raw any, path string) (Selector, error) {
	if raw == nil {
		return Selector{}, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return Selector{}, fmt.Errorf("%s: an OS image selector must be a map of image field to pattern, got %s", path, osimage.Describe(raw))
	}
	// Helm users quote booleans often enough that "true" is accepted too.
	// A null is refused like any null pattern.
	extra, err := values.Bool(m, KeyUseExtraKeys, path+"."+KeyUseExtraKeys, false)
	if v, ok := m[KeyUseExtraKeys]; ok && v == nil {
		err = fmt.Errorf("%s.%s: must be true or false, got null", path, KeyUseExtraKeys)
	}
	if err != nil {
		return Selector{}, err
	}
	var s Selector
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if k == KeyUseExtraKeys {
			continue
		}
		if !extra && !baseKeys[k] {
			return Selector{}, fmt.Errorf("%s: OS selector key '%s': this key is not among the supported base keys (set %s: true to allow it)", path, k, KeyUseExtraKeys)
		}
		var pattern string
		switch t := v.(type) {
		case string:
			pattern = t
		case bool:
			pattern = strconv.FormatBool(t)
		default:
			return Selector{}, fmt.Errorf("%s: OS selector key '%s': the pattern must be a string or a boolean, got %s", path, k, osimage.Describe(v))
		}
		t, err := newTerm(k, pattern)
		if err != nil {
			return Selector{}, fmt.Errorf("%s: %w", path, err)
		}
		s.terms = append(s.terms, t)
	}
	return s, nil
}

func newTerm(key, pattern string) (term, error) {
	c, err := compile(pattern)
	if err != nil {
		return term{}, fmt.Errorf("OS selector key '%s': invalid regular expression %q: %v", key, pattern, err)
	}
	return term{key: key, pattern: pattern, compiled: c}, nil
}

// Matches says whether the image named key matches every term of s.
//
// It reads the image as Sylva's selector-matches-os-image does: keys in
// sorted order, the first pattern that does not match ends the test, and a
// field that it reads must be a string or a boolean (a boolean reads as
// "true" or "false"); any other value is an error naming the image and the
// field. A field that no term reads is never looked at, so an image ruled
// out by an earlier key is not checked further, exactly as in Sylva.
func (s Selector) Matches(key string, img osimage.Image) (bool, error) {
	if img == nil {
		return false, fmt.Errorf("os_images.%s: the image entry is null, not a map of image fields; remove it or give its fields", key)
	}
	// Plain-word terms are checked first when no term before them could
	// fail: they are cheap and reject most images of a catalog before any
	// regexp runs. Which term rejects an image only matters for errors,
	// and a term can only fail on a field of the wrong type, which this
	// pass checks on the way.
	for i := range s.terms {
		t := &s.terms[i]
		v, err := value(t.key, key, img)
		if err != nil {
			return s.matchInOrder(key, img)
		}
		if t.isLiteral && !t.match(v) {
			return false, nil
		}
	}
	for i := range s.terms {
		if t := &s.terms[i]; !t.isLiteral {
			v, _ := value(t.key, key, img)
			if !t.match(v) {
				return false, nil
			}
		}
	}
	return true, nil
}

// matchInOrder is Matches term by term in key order, for an image that
// holds a field of the wrong type: it is an error only if every term
// before it matches.
func (s Selector) matchInOrder(key string, img osimage.Image) (bool, error) {
	for i := range s.terms {
		t := &s.terms[i]
		v, err := value(t.key, key, img)
		if err != nil {
			return false, fmt.Errorf("os_images.%s.%s: %w", key, t.key, err)
		}
		if !t.match(v) {
			return false, nil
		}
	}
	return true, nil
}

// value is what the term for field is matched against.
func value(field, key string, img osimage.Image) (string, error) {
	if field == KeyImageKey {
		return key, nil
	}
	v, ok := img[field]
	if !ok {
		return Unset, nil
	}
	switch t := v.(type) {
	case string:
		return t, nil
	case bool:
		return strconv.FormatBool(t), nil
	}
	hint := ""
	if _, ok := v.(float64); ok {
		hint = ` (quote it in the catalog, as in "15.10", so that its text is kept)`
	}
	return "", fmt.Errorf("an OS image selector reads this field, which holds %s, not a string or a boolean%s", osimage.Describe(v), hint)
}

// Select returns the sorted keys of the images of cat that s matches, or
// the error of the first image (in key order) that cannot be tested.
func (s Selector) Select(cat osimage.Catalog) ([]string, error) {
	return List{s}.Select(cat)
}

// Has says whether s holds a pattern for key.
func (s Selector) Has(key string) bool {
	_, ok := s.find(key)
	return ok
}

func (s Selector) find(key string) (int, bool) {
	i := sort.Search(len(s.terms), func(i int) bool { return s.terms[i].key >= key })
	return i, i < len(s.terms) && s.terms[i].key == key
}

// with returns a copy of s where key has pattern, leaving s untouched.
func (s Selector) with(key, pattern string) (Selector, error) {
	t, err := newTerm(key, pattern)
	if err != nil {
		return Selector{}, err
	}
	i, found := s.find(key)
	terms := make([]term, 0, len(s.terms)+1)
	terms = append(terms, s.terms[:i]...)
	terms = append(terms, t)
	if found {
		i++
	}
	terms = append(terms, s.terms[i:]...)
	return Selector{terms: terms}, nil
}

// Map returns s as a key -> pattern map, the form it was written in.
func (s Selector) Map() map[string]string {
	m := make(map[string]string, len(s.terms))
	for _, t := range s.terms {
		m[t.key] = t.pattern
	}
	return m
}

// String shows s in error messages, keys sorted, patterns unquoted so that
// a backslash reads as the user wrote it.
func (s Selector) String() string {
	var b strings.Builder
	b.WriteByte('{')
	for i, t := range s.terms {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(t.key)
		b.WriteString(": ")
		b.WriteString(t.pattern)
	}
	b.WriteByte('}')
	return b.String()
}

// List is a set of selectors that matches an image when any of them does.
type List []Selector

// Select returns the sorted keys of the images of cat that any selector of
// l matches. As Sylva's select-os-images, it tests every image against
// every selector, and fails on an empty catalog and on the first image
// that cannot be tested (selectors in order, images in key order).
func (l List) Select(cat osimage.Catalog) ([]string, error) {
	if len(cat) == 0 {
		return nil, errEmptyCatalog
	}
	var keys []string
	var seen map[string]bool // only needed when several selectors may match one image
	if len(l) > 1 {
		seen = map[string]bool{}
	}
	for _, s := range l {
		var firstBad string
		var badErr error
		for k, img := range cat {
			ok, err := s.Matches(k, img)
			if err != nil {
				// Map order is random; the smallest key keeps the
				// error the same from run to run.
				if badErr == nil || k < firstBad {
					firstBad, badErr = k, err
				}
				continue
			}
			if ok && !seen[k] {
				if seen != nil {
					seen[k] = true
				}
				keys = append(keys, k)
			}
		}
		if badErr != nil {
			return nil, badErr
		}
	}
	slices.Sort(keys)
	return keys, nil
}

var errEmptyCatalog = errors.New("os_images is empty: there is no OS image to select from")
