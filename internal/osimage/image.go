// Package osimage holds the records that the parts of osimages exchange: an
// image's metadata fields (contract §1), the os_images document published as
// os-images-info (§3) and the served-set document (§6).
package osimage

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Field names of an image record. Every value is a string.
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

// Image is the metadata of one OS image: field name -> string value.
type Image map[string]string

// Clone returns a copy that can be changed without touching i.
func (i Image) Clone() Image {
	out := make(Image, len(i))
	for k, v := range i {
		out[k] = v
	}
	return out
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

// KeyPattern is the form of a key of os_images and sylva_diskimagebuilder_images.
var KeyPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{1,50}[a-z0-9]$`)

// ValidateKey says why key cannot name an image, or nil.
func ValidateKey(key string) error {
	if !KeyPattern.MatchString(key) {
		return fmt.Errorf("key must match %s", KeyPattern.String())
	}
	return nil
}

var hexDigits = map[string]int{FieldSHA256: 64, FieldMD5: 32}

// ValidateDigestField says why the value of a digest field (sha256, md5) is
// malformed, or nil. Other fields are free-form.
func ValidateDigestField(field, value string) error {
	n, ok := hexDigits[field]
	if !ok {
		return nil
	}
	if len(value) != n || strings.Trim(value, "0123456789abcdef") != "" {
		return fmt.Errorf("%s %q is not %d lowercase hex digits", field, value, n)
	}
	return nil
}

// Catalog is an os_images map: image key -> image.
type Catalog map[string]Image

// Keys returns the image keys in sorted order.
func (c Catalog) Keys() []string { return slices.Sorted(maps.Keys(c)) }
