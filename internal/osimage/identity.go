package osimage

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/opencontainers/go-digest"
)

// The identity of a served image: its sha256, the file name it is served
// under, and the path that joins them (contract §5). Each has one rule,
// here, that the catalog, the image server, the store, render, the Metal3
// reference tracker, the fleet check and plan all apply, so that what one
// accepts the others accept too: the server never stores an image that
// render refuses to reference, and render never writes a URL that the
// server does not answer.

// SHA256 is the sha256 of an image file as served: 64 lowercase
// hexadecimal digits. It names the image in the served set, the store and
// the URL.
type SHA256 string

func (s SHA256) String() string { return string(s) }

// ParseSHA256 is the one parser of a sha256. An uppercase digest is
// refused rather than lowercased: one image must have one name, and a
// lowercased copy would give it two (two served-set keys, two URLs, a
// catalog value that differs from the served one).
func ParseSHA256(s string) (SHA256, error) {
	if err := checkHex(FieldSHA256, s, 64); err != nil {
		return "", err
	}
	return SHA256(s), nil
}

// Validate says why s is not what ParseSHA256 gives: a value that reached
// a SHA256 by a conversion. The store checks it again before it makes a
// path of it, so that no bug elsewhere can lead it out of its directory.
func (s SHA256) Validate() error { return checkHex(FieldSHA256, string(s), 64) }

// ValidateMD5 says why s is not an md5 as the catalog records it: 32
// lowercase hexadecimal digits.
func ValidateMD5(s string) error { return checkHex(FieldMD5, s, 32) }

func checkHex(field, s string, n int) error {
	if len(s) != n {
		return fmt.Errorf("%s %q is not %d lowercase hex digits", field, truncate(s), n)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			if 'A' <= c && c <= 'F' {
				return fmt.Errorf("%s %q is not %d lowercase hex digits: write it in lowercase", field, truncate(s), n)
			}
			return fmt.Errorf("%s %q is not %d lowercase hex digits", field, truncate(s), n)
		}
	}
	return nil
}

// MaxFilenameBytes is NAME_MAX of Linux file systems: the store keeps the
// image under its filename.
const MaxFilenameBytes = 255

// The checksum files served beside each image, at its path plus these.
const (
	SHA256SumSuffix = ".sha256sum"
	MD5SumSuffix    = ".md5sum"
)

// ValidateFilename is the one rule for the name an image is served and
// stored under: a plain, printable file name. It is refused when it is
// empty or longer than MaxFilenameBytes, is not UTF-8, holds a control
// character (a newline would write a second line into the .sha256sum file),
// a "/" or a "\" (a path, or one on another system; sha256sum escapes a
// backslash), starts with "." (".", "..", and the store's own files), or
// ends with a checksum file's suffix (its URL would be the checksum's of
// another name). "%", "#", "?", spaces and non-ASCII letters are fine: the
// path escapes them (ImagePath).
func ValidateFilename(name string) error {
	switch {
	case name == "":
		return errors.New("image filename is empty: give the image a filename field")
	case len(name) > MaxFilenameBytes:
		return fmt.Errorf("image filename %q is longer than %d bytes", truncate(name), MaxFilenameBytes)
	case !utf8.ValidString(name):
		return fmt.Errorf("image filename %q is not UTF-8", truncate(name))
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("image filename %q holds a control character (newline, carriage return, escape, NUL...)", truncate(name))
	case strings.ContainsAny(name, `/\`):
		return fmt.Errorf(`image filename %q holds "/" or "\": it must be a plain file name, without a path`, truncate(name))
	case strings.HasPrefix(name, "."):
		return fmt.Errorf(`image filename %q starts with ".": it must be a plain, visible file name`, truncate(name))
	case strings.HasSuffix(name, SHA256SumSuffix) || strings.HasSuffix(name, MD5SumSuffix):
		return fmt.Errorf("image filename %q ends with %s or %s, the suffixes of the checksum files served beside images", truncate(name), SHA256SumSuffix, MD5SumSuffix)
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// imagesPrefix starts every image path.
const imagesPrefix = "/images/"

// ImagePath is where osimages serves an image: /images/<sha256>/<filename>,
// the filename escaped as one path segment ("a b#1.raw" is "a%20b%231.raw").
// Add SHA256SumSuffix or MD5SumSuffix for its checksum files. The path
// derives from the image alone, so renaming or re-keying it on the
// management side changes no URL.
func ImagePath(sha SHA256, filename string) string {
	return imagesPrefix + string(sha) + "/" + url.PathEscape(filename)
}

// OCIRepository is the repository of the OCI distribution API where
// osimages serves an image: images/<sha256>, so that an oci:// URL, like an
// image URL, names the image it is for (OCIReference).
func OCIRepository(sha SHA256) string { return strings.TrimPrefix(imagesPrefix, "/") + string(sha) }

// OCIDiskTypes are the tags by which the repository of every image
// answers with an index whose one manifest is annotated with that disk
// type: Ironic reads an oci:// image's disk format from the `disktype`
// annotation of the manifests of a tag's index, and knows these two (any
// other makes it skip the manifest). Sorted.
var OCIDiskTypes = []string{"qcow2", "raw"}

// OCIReference is what an oci:// URL of an osimages server names, in one
// of two forms, each naming exactly one immutable image (the repository
// is its sha256):
//   - oci://<host>/images/<sha256>:<disk type>, a tag of OCIDiskTypes
//     (DiskType): what render writes, since Ironic learns the disk format
//     from the tag's index only;
//   - oci://<host>/images/<sha256>@<manifest digest> (Manifest): what
//     render wrote before, still answered; Ironic cannot tell its disk
//     format, and its agent then copies the whole image into its RAM.
type OCIReference struct {
	Host   string
	SHA256 SHA256
	// DiskType is the tag, one of OCIDiskTypes; "" in the digest form.
	DiskType string
	// Manifest is the manifest digest, sha256:<hex>; "" in the tag form.
	Manifest digest.Digest
}

// String is the oci:// URL.
func (r OCIReference) String() string {
	if r.DiskType != "" {
		return "oci://" + r.Host + "/" + OCIRepository(r.SHA256) + ":" + r.DiskType
	}
	return "oci://" + r.Host + "/" + OCIRepository(r.SHA256) + "@" + r.Manifest.String()
}

// ParseOCIReference reads an oci:// URL that OCIReference.String can have
// built, in either form, and false for any other: another scheme or
// repository, another tag, a sha256 that ParseSHA256 refuses.
func ParseOCIReference(ref string) (OCIReference, bool) {
	rest, ok := strings.CutPrefix(ref, "oci://")
	if !ok {
		return OCIReference{}, false
	}
	host, path, ok := strings.Cut(rest, "/")
	if !ok || host == "" {
		return OCIReference{}, false
	}
	repo, manifest, byDigest := strings.Cut(path, "@")
	var diskType string
	if !byDigest {
		var byTag bool
		if repo, diskType, byTag = strings.Cut(path, ":"); !byTag || !slices.Contains(OCIDiskTypes, diskType) {
			return OCIReference{}, false
		}
	}
	rawSHA, ok := strings.CutPrefix(repo, strings.TrimPrefix(imagesPrefix, "/"))
	if !ok {
		return OCIReference{}, false
	}
	sha, err := ParseSHA256(rawSHA)
	if err != nil {
		return OCIReference{}, false
	}
	if byDigest {
		hex, ok := strings.CutPrefix(manifest, "sha256:")
		if _, err := ParseSHA256(hex); !ok || err != nil {
			return OCIReference{}, false
		}
	}
	return OCIReference{Host: host, SHA256: sha, DiskType: diskType, Manifest: digest.Digest(manifest)}, true
}

// ServedFile is a file an image path names: the image itself, or one of
// its checksum files.
type ServedFile struct {
	SHA256 SHA256
	// Filename is the image's filename, unescaped.
	Filename string
	// Checksum is "" for the image, or SHA256SumSuffix or MD5SumSuffix.
	Checksum string
}

// Name is the last segment of the path, unescaped: the filename, with the
// checksum suffix when there is one.
func (f ServedFile) Name() string { return f.Filename + f.Checksum }

// ParseImagePath is the one parser of the paths ImagePath builds (and of
// its checksum files'). escaped is a URL's path as sent, not yet unescaped
// (url.URL.EscapedPath), so that an encoded "/" stays inside the segment it
// was in, and is then refused by the filename rule. ok is false for any
// path that ImagePath cannot have built: another prefix or depth, a sha256
// that ParseSHA256 refuses, a filename that ValidateFilename refuses.
func ParseImagePath(escaped string) (ServedFile, bool) {
	rest, found := strings.CutPrefix(escaped, imagesPrefix)
	if !found {
		return ServedFile{}, false
	}
	rawSHA, rawName, found := strings.Cut(rest, "/")
	if !found || strings.Contains(rawName, "/") {
		return ServedFile{}, false
	}
	sha, err := ParseSHA256(rawSHA)
	if err != nil {
		return ServedFile{}, false
	}
	name, err := url.PathUnescape(rawName)
	if err != nil {
		return ServedFile{}, false
	}
	f := ServedFile{SHA256: sha, Filename: name}
	for _, suffix := range []string{SHA256SumSuffix, MD5SumSuffix} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			f.Filename, f.Checksum = base, suffix
			break
		}
	}
	if ValidateFilename(f.Filename) != nil {
		return ServedFile{}, false
	}
	return f, true
}

// SHA256 returns the image's sha256, read and checked by the one rule.
func (i Image) SHA256() (SHA256, error) {
	s, err := i.StringField(FieldSHA256)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", errors.New("no sha256")
	}
	return ParseSHA256(s)
}

// Filename returns the image's filename, read and checked by the one rule.
func (i Image) Filename() (string, error) {
	s, err := i.StringField(FieldFilename)
	if err != nil {
		return "", err
	}
	if err := ValidateFilename(s); err != nil {
		return "", err
	}
	return s, nil
}

// ServedAt is the served-image rule: what an image of (A) must hold for
// the management cluster to serve it to capm3, at /images/<sha256>/<filename>.
// Render, the fleet check (the picks of a cluster's values) and the
// aggregator of the fleet's needs all call it, so that an image one of them
// accepts is never refused by another: a sha256 that render would refuse
// never becomes a need that the image server has to parse. name is how
// messages call the image, such as "os_images.<key>"; every fault is
// reported.
func (i Image) ServedAt(name string) (SHA256, string, error) {
	var errs []error
	var sha SHA256
	raw, err := i.StringField(FieldSHA256)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
	case raw == "":
		errs = append(errs, fmt.Errorf("%s has no sha256, so it cannot be served for capm3", name))
	default:
		if sha, err = ParseSHA256(raw); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	filename, err := i.StringField(FieldFilename)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
	case filename == "":
		errs = append(errs, fmt.Errorf("%s has no filename, so it cannot be served for capm3", name))
	default:
		if err := ValidateFilename(filename); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	if len(errs) > 0 {
		return "", "", errors.Join(errs...)
	}
	return sha, filename, nil
}
