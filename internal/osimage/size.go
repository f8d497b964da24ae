package osimage

import (
	"cmp"
	"errors"
	"fmt"
	"math"

	"github.com/opencontainers/go-digest"
)

// ParseSize reads the value of a size field (size, archive-size): a number
// of bytes written as a decimal integer, digits only. An empty value is 0,
// which means unknown. Signs, spaces, exponents, hexadecimal, fractions and
// values past the largest int64 are refused, so that a size can never wrap
// around in a sum or slip past a bound.
func ParseSize(value string) (int64, error) {
	if value == "" {
		return 0, nil
	}
	var n int64
	for i := 0; i < len(value); i++ {
		c := value[i]
		if c < '0' || c > '9' {
			if c == '-' && i == 0 {
				return 0, errors.New("is negative: a size is a number of bytes")
			}
			return 0, errors.New("is not a decimal integer: write the number of bytes in digits only, such as \"22000000000\"")
		}
		d := int64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, fmt.Errorf("is larger than %d bytes, the largest size there can be", int64(math.MaxInt64))
		}
		n = n*10 + d
	}
	return n, nil
}

// Size is the value of the size field of i (FieldSize or
// FieldArchiveSize), 0 when absent or empty. Its error names the field and
// the value; callers add which image it is.
func (i Image) Size(field string) (int64, error) {
	v, err := i.StringField(field)
	if err != nil {
		return 0, err
	}
	n, err := ParseSize(v)
	if err != nil {
		return 0, fmt.Errorf("%s %q %w", field, truncate(v), err)
	}
	return n, nil
}

// Descriptor is what osimages acts on in an image record, parsed once
// where the served set takes the record (Image.Descriptor) and carried to
// fill, pull and the replica wire, as oras-go carries a descriptor: no
// later reader re-reads the untyped record, so all read a field alike. The
// record itself stays for what the output republishes.
type Descriptor struct {
	Filename, URI, MD5, Compression, RegistryKey string
	// ManifestDigest pins the OCI manifest (oci-manifest-digest); "" when
	// the record pins none or a malformed one.
	ManifestDigest digest.Digest
	// Size and ArchiveSize are 0 when the record declares none or a
	// malformed one.
	Size, ArchiveSize int64
	// Err says why a size or the manifest digest is malformed, naming the
	// field and the value. It refuses the download, not the selection, so
	// that the image's other filenames and records stay served and its
	// status tells the operator the fault.
	Err error
}

// Descriptor parses what osimages acts on in i. A field that is not a
// string reads as absent (Get): the catalog and selection refuse those.
func (i Image) Descriptor() Descriptor {
	d := Descriptor{Filename: i.Get(FieldFilename), URI: i.Get(FieldURI), MD5: i.Get(FieldMD5),
		Compression: i.Get(FieldCompression), RegistryKey: i.Get(FieldRegistryKey)}
	var sizeErr, archiveErr, digestErr error
	d.Size, sizeErr = i.Size(FieldSize)
	d.ArchiveSize, archiveErr = i.Size(FieldArchiveSize)
	if v := i.Get(FieldManifestDigest); v != "" {
		if d.ManifestDigest, digestErr = digest.Parse(v); digestErr != nil {
			d.ManifestDigest = ""
			digestErr = fmt.Errorf("%s %q is not an OCI digest such as \"sha256:\" and 64 hex digits: %w", FieldManifestDigest, truncate(v), digestErr)
		}
	}
	d.Err = cmp.Or(sizeErr, archiveErr, digestErr)
	return d
}

// Bound is the most bytes the image's file may have: its declared size,
// or maxImageSize when it declares none.
func (d Descriptor) Bound(maxImageSize int64) int64 {
	return cmp.Or(d.Size, maxImageSize)
}

// DiskCost is what the image takes on disk while it downloads, its Bound
// and the archive it is unpacked from: the one measure of the space
// reservation, of the management selection's share of the storage and of
// a fleet need's. It never wraps around.
func (d Descriptor) DiskCost(maxImageSize int64) int64 {
	return AddSizes(d.Bound(maxImageSize), d.ArchiveSize)
}

// FormatBytes writes n bytes in binary units for messages: "512 B",
// "1.5 GiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// AddSizes adds sizes without wrapping around: past the largest int64,
// the sum is that.
func AddSizes(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
