package osimage

import (
	"strings"
	"testing"
)

func TestParseSHA256(t *testing.T) {
	good := strings.Repeat("0123456789abcdef", 4)
	if s, err := ParseSHA256(good); err != nil || string(s) != good {
		t.Errorf("%q: %v", good, err)
	}
	for _, bad := range []string{"", good[:63], good + "0", strings.ToUpper(good), " " + good[1:], good[:63] + "g"} {
		if _, err := ParseSHA256(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := ParseSHA256(strings.ToUpper(good)); err == nil || !strings.Contains(err.Error(), "lowercase") {
		t.Errorf("uppercase: %v", err)
	}
}

func TestValidateFilename(t *testing.T) {
	for _, ok := range []string{"ubuntu.raw", "a b.raw", "100%.raw", "a#b.raw", "é.raw", "a..b.raw", strings.Repeat("x", 255)} {
		if err := ValidateFilename(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, why := range map[string]string{
		"":                        "empty",
		strings.Repeat("x", 256):  "longer than 255",
		"a\nb":                    "control character",
		"a\rb":                    "control character",
		"a\x1bb":                  "control character",
		"a\x00b":                  "control character",
		"a\u0085b":                "control character",
		"a/b":                     `"/"`,
		`a\b`:                     `"/"`,
		".":                       `starts with "."`,
		"..":                      `starts with "."`,
		".hidden":                 `starts with "."`,
		"a.raw" + SHA256SumSuffix: "suffixes of the checksum files",
		"a.raw" + MD5SumSuffix:    "suffixes of the checksum files",
		"a\xffb":                  "not UTF-8",
	} {
		if err := ValidateFilename(bad); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%q: %v, want %q", bad, err, why)
		}
	}
}

func TestImageIdentity(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	img := Image{FieldSHA256: sha, FieldFilename: "a b.raw"}
	if s, name, err := img.ServedAt("img"); err != nil || ImagePath(s, name) != "/images/"+sha+"/a%20b.raw" {
		t.Errorf("ServedAt = %s %q, %v", s, name, err)
	}
	for _, bad := range []Image{{FieldFilename: "a.raw"}, {FieldSHA256: 12.0, FieldFilename: "a.raw"}, {FieldSHA256: sha, FieldFilename: "a\n"}, {FieldSHA256: sha}} {
		if s, name, err := bad.ServedAt("bad"); err == nil {
			t.Errorf("%v: served at %s %q", bad, s, name)
		}
	}
}
