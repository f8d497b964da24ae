// Package osimage holds the records that the parts of osimages exchange: an
// image's metadata fields (contract §1), the os_images document published as
// os-images-info (§3) and the served-set document (§6).
package osimage

import (
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sylva-projects/osimages/internal/values"
)

// Field names of an image record. The catalog publishes each as a string.
const (
	FieldURI          = "uri"
	FieldRegistryKey  = "oci-image-registry-key"
	FieldSHA256       = "sha256"
	FieldMD5          = "md5"
	FieldFilename     = "filename"
	FieldImageFormat  = "image-format"
	FieldCompression  = "compression"
	FieldArchiveSize  = "archive-size"
	FieldSize         = "size"
	FieldOS           = "os"
	FieldOSRelease    = "os-release"
	FieldFlavor       = "flavor"
	FieldHardened     = "hardened"
	FieldK8sFlavor    = "k8s-flavor"
	FieldK8sVersion   = "k8s-version"
	FieldCommitID     = "commit-id"
	FieldCommitTag    = "commit-tag"
	AnnotationPrefix  = "sylvaproject.org/diskimage/"
	annotationKeyPart = "sylva"
)

// FieldManifestDigest is an osimages addition: the digest of the OCI
// manifest the catalog resolved (and whose cosign signature it verified,
// when the registry has a key). The image server refuses to pull another
// manifest for the image.
const FieldManifestDigest = "oci-manifest-digest"

// Image is the metadata of one OS image: field name -> value, as YAML
// decoding gives it. What osimages publishes is strings (and the booleans
// and maps a catalog's author declared), but a hand-written os_images may
// hold numbers, nulls, maps or lists too: they are kept as they are, never
// re-formatted, and refused only where they are read (a selector reads a
// field, the image server and render read sha256, filename and the like).
//
// A nil Image in a Catalog is an entry that is null (os_images.KEY: ~); a
// selector that meets it fails, as Sylva's does.
type Image map[string]any

// Get returns the value of field when it is a string, "" when it is absent
// or of another type. It is for fields whose type was checked, and for
// messages; where a wrong type must be an error, use StringField.
func (i Image) Get(field string) string {
	s, _ := i[field].(string)
	return s
}

// StringField returns the value of field, "" when it is absent, and an
// error naming the field when it is not a string: no other value is turned
// into one, so that what osimages reads is what the catalog says.
func (i Image) StringField(field string) (string, error) {
	v, ok := i[field]
	if !ok {
		return "", nil
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	return "", fmt.Errorf("field %s holds %s, not a string", field, Describe(v))
}

// Clone returns a deep copy that can be changed without touching i.
func (i Image) Clone() Image {
	if i == nil {
		return nil
	}
	return values.DeepCopy(map[string]any(i)).(map[string]any)
}

// Describe names the kind of a YAML value in messages, with the value
// when it is a scalar: "the number 15.1", "null", "a map".
func Describe(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("the string %q", t)
	case bool:
		return fmt.Sprintf("the boolean %t", t)
	case float64:
		// 'f' keeps 22000000000 from reading 2.2e+10.
		if t == math.Trunc(t) && math.Abs(t) < 1e21 {
			return "the number " + strconv.FormatFloat(t, 'f', -1, 64)
		}
		return fmt.Sprintf("the number %v", t)
	case float32, int, int64, int32, uint64:
		return fmt.Sprintf("the number %v", t)
	case map[string]any, Image:
		return "a map"
	case []any:
		return "a list"
	default:
		return fmt.Sprintf("a %T", t)
	}
}

// FieldsFromAnnotations keeps the annotations whose key contains "sylva" and
// names each by the part of its key after the last "/", as Sylva's
// os-images-info job does.
func FieldsFromAnnotations(annotations map[string]string) Image {
	out := Image{}
	for k, v := range annotations {
		if !strings.Contains(k, annotationKeyPart) {
			continue
		}
		if name := k[strings.LastIndex(k, "/")+1:]; name != "" {
			out[name] = v
		}
	}
	return out
}

// keyPattern is the form of a key of os_images and
// sylva_diskimagebuilder_images. It is compiled at its first use, not at
// package init, which every command of the binary runs (200 allocations).
var keyPattern = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{1,50}[a-z0-9]$`)
})

// ValidateKey says why key cannot name an image, or nil.
func ValidateKey(key string) error {
	if !keyPattern().MatchString(key) {
		return fmt.Errorf("key must match %s", keyPattern().String())
	}
	return nil
}

// Catalog is an os_images map: image key -> image.
type Catalog map[string]Image

// Keys returns the image keys in sorted order.
func (c Catalog) Keys() []string { return slices.Sorted(maps.Keys(c)) }

// KeyOf returns the key whose record pins sha: prefer when its record
// does, else the first in sort order, "" when none does. A malformed
// sha256 pins nothing, as the server would not serve it.
func (c Catalog) KeyOf(sha SHA256, prefer string) string {
	for _, k := range append([]string{prefer}, c.Keys()...) {
		if got, err := c[k].SHA256(); err == nil && got == sha {
			return k
		}
	}
	return ""
}
