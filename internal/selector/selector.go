// Package selector implements the OS image selectors of contract §4:
// parsing and validating them, matching them against image records,
// finalizing them for a cluster and picking the one image they designate.
package selector

import (
	"fmt"
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
// selector; a nil value removes its key, as a null does in Helm values.
// path names the selector in error messages.
func Parse(raw any, path string) (Selector, error) {
	if raw == nil {
		return Selector{}, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return Selector{}, fmt.Errorf("%s: an OS image selector must be a map of image field to pattern, got %s", path, describe(raw))
	}
	// Helm users quote booleans often enough that "true" is accepted too.
	extra, err := values.Bool(m, KeyUseExtraKeys, path+"."+KeyUseExtraKeys, false)
	if err != nil {
		return Selector{}, err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var s Selector
	for _, k := range keys {
		v := m[k]
		if k == KeyUseExtraKeys || v == nil {
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
			return Selector{}, fmt.Errorf("%s: OS selector key '%s': the pattern must be a string or a boolean, got %s", path, k, describe(v))
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
func (s Selector) Matches(key string, img osimage.Image) bool {
	// Plain-word terms go first: they are cheap and reject most images of a
	// catalog before any regexp runs.
	for i := range s.terms {
		if t := &s.terms[i]; t.isLiteral && !t.match(value(t.key, key, img)) {
			return false
		}
	}
	for i := range s.terms {
		if t := &s.terms[i]; !t.isLiteral && !t.match(value(t.key, key, img)) {
			return false
		}
	}
	return true
}

// value is what the term for field is matched against.
func value(field, key string, img osimage.Image) string {
	if field == KeyImageKey {
		return key
	}
	if v, ok := img[field]; ok {
		return v
	}
	return Unset
}

// Select returns the sorted keys of the images of cat that s matches.
func (s Selector) Select(cat osimage.Catalog) []string {
	var keys []string
	for k, img := range cat {
		if s.Matches(k, img) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
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

// Matches says whether any selector of l matches the image.
func (l List) Matches(key string, img osimage.Image) bool {
	for _, s := range l {
		if s.Matches(key, img) {
			return true
		}
	}
	return false
}

// Select returns the sorted keys of the images of cat that l matches.
func (l List) Select(cat osimage.Catalog) []string {
	var keys []string
	for k, img := range cat {
		if l.Matches(k, img) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func describe(v any) string {
	switch t := v.(type) {
	case map[string]any:
		return "a map"
	case []any:
		return "a list"
	case string:
		return strconv.Quote(t)
	case nil:
		return "null"
	default:
		return fmt.Sprintf("%v (%T)", t, t)
	}
}
