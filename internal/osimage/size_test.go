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
	if d := img.Descriptor(); d.SizeErr == nil || !strings.Contains(d.SizeErr.Error(), "size") || d.Size != 0 || d.ArchiveSize != 12 {
		t.Errorf("Descriptor = %+v", d)
	}
	if err := (Image{FieldArchiveSize: "-1"}).Descriptor().SizeErr; err == nil || !strings.HasPrefix(err.Error(), `archive-size "-1" is negative`) {
		t.Errorf("SizeErr = %v", err)
	}
}
