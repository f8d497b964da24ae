package osimage

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{"", 0, ""},
		{"0", 0, ""},
		{"2097152", 2097152, ""},
		{"007", 7, ""},
		{"9223372036854775807", 9223372036854775807, ""},
		{"9223372036854775808", 0, "larger than"},
		{"99999999999999999999", 0, "larger than"},
		{"-5", 0, "negative"},
		{"+5", 0, "not a decimal integer"},
		{"lots", 0, "not a decimal integer"},
		{"2.097152e6", 0, "not a decimal integer"},
		{"0x200000", 0, "not a decimal integer"},
		{"1 024", 0, "not a decimal integer"},
		{" 1024", 0, "not a decimal integer"},
		{"1Gi", 0, "not a decimal integer"},
	} {
		got, err := ParseSize(tc.in)
		if tc.err == "" && (err != nil || got != tc.want) {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ParseSize(%q) = %d, %v; want an error saying %q", tc.in, got, err, tc.err)
		}
	}
}

func TestImageSizeNamesTheField(t *testing.T) {
	img := Image{FieldSize: "lots", FieldArchiveSize: "12"}
	if n, err := img.Size(FieldArchiveSize); err != nil || n != 12 {
		t.Errorf("archive-size = %d, %v", n, err)
	}
	_, err := img.Size(FieldSize)
	if err == nil || !strings.HasPrefix(err.Error(), `size "lots" is not a decimal integer`) {
		t.Errorf("error = %v, want one naming the field and the value", err)
	}
	if d := img.Descriptor(); d.Err == nil || !strings.Contains(d.Err.Error(), "size") || d.Size != 0 || d.ArchiveSize != 12 {
		t.Errorf("Descriptor = %+v", d)
	}
	if err := (Image{FieldArchiveSize: "-1"}).Descriptor().Err; err == nil || !strings.HasPrefix(err.Error(), `archive-size "-1" is negative`) {
		t.Errorf("Err = %v", err)
	}
}

// TestDescriptorParsesTheManifestDigest: the manifest digest is parsed once,
// into a digest.Digest; a malformed one is absent and Err names the field
// and the value.
func TestDescriptorParsesTheManifestDigest(t *testing.T) {
	good := "sha256:" + strings.Repeat("ab", 32)
	if d := (Image{FieldManifestDigest: good}).Descriptor(); d.Err != nil || d.ManifestDigest.String() != good {
		t.Errorf("Descriptor = %+v, want the digest %s", d, good)
	}
	for _, bad := range []string{"sha256:zz", "latest", "sha256:abc", "md5:" + strings.Repeat("ab", 16)} {
		d := (Image{FieldManifestDigest: bad}).Descriptor()
		if d.ManifestDigest != "" || d.Err == nil || !strings.HasPrefix(d.Err.Error(), FieldManifestDigest+` "`+bad+`" is not an OCI digest`) {
			t.Errorf("%s: Descriptor = %+v, want no digest and an error naming %s and the value", bad, d, FieldManifestDigest)
		}
	}
}
