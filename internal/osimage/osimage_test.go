package osimage

import (
	"strings"
	"testing"
)

func TestFieldsFromAnnotations(t *testing.T) {
	got := FieldsFromAnnotations(map[string]string{
		"sylvaproject.org/diskimage/sha256":      "abc",
		"sylvaproject.org/diskimage/k8s-version": "1.32.5+rke2r1",
		"org.opencontainers.image.created":       "2026-01-01T00:00:00Z",
		"example.org/sylva-extra/flavor-note":    "kept: key contains sylva",
		"sylva-but-no-slash":                     "named by the whole key",
	})
	want := Image{"sha256": "abc", "k8s-version": "1.32.5+rke2r1", "flavor-note": "kept: key contains sylva", "sylva-but-no-slash": "named by the whole key"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestInfoRoundTrip(t *testing.T) {
	c := Catalog{"b-image": {"sha256": "x", "size": "12"}, "a-image": {"uri": "oci://r/a:1"}}
	doc, err := MarshalInfo(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(doc), "os_images:\n  a-image:") {
		t.Errorf("keys not sorted:\n%s", doc)
	}
	back, err := ParseInfo(doc)
	if err != nil || back["b-image"]["size"] != "12" || back["a-image"]["uri"] != "oci://r/a:1" {
		t.Errorf("round trip: %v %v", back, err)
	}
	// Hand-written documents leave numbers and booleans unquoted.
	loose, err := ParseInfo([]byte("os_images:\n  x: {size: 22000000000, hardened: true, os-release: 15.6}\n"))
	if err != nil || loose["x"]["size"] != "22000000000" || loose["x"]["hardened"] != "true" || loose["x"]["os-release"] != "15.6" {
		t.Errorf("loose scalars: %v %v", loose, err)
	}
	if _, err := ParseInfo([]byte("os_images:\n  x: {labels: [a]}\n")); err == nil || !strings.Contains(err.Error(), "os_images.x.labels") {
		t.Errorf("a list field: %v", err)
	}
}

func TestServedIsStrict(t *testing.T) {
	s, err := ParseServed([]byte("capm3_os_image_server_images:\n  abc: {available: true, image_key: k}\n"))
	if err != nil || !s["abc"].Available || s["abc"].ImageKey != "k" {
		t.Fatalf("%v %v", s, err)
	}
	if _, err := ParseServed([]byte("capm3_os_image_server_images:\n  abc: {available: true, image_key: k, url: x}\n")); err == nil {
		t.Error("an entry with a third field is accepted; the consumer's schema refuses it")
	}
	doc, _ := MarshalServed(ServedSet{"abc": {Available: false, ImageKey: "k"}})
	if string(doc) != "capm3_os_image_server_images:\n  abc:\n    available: false\n    image_key: k\n" {
		t.Errorf("served document:\n%s", doc)
	}
}

func TestValuesDocument(t *testing.T) {
	plain := []byte("os_images: {}\n")
	if doc, err := ValuesDocument(plain); err != nil || string(doc) != string(plain) {
		t.Errorf("plain document: %q %v", doc, err)
	}
	cm := []byte("apiVersion: v1\nkind: ConfigMap\ndata:\n  values.yaml: |\n    os_images: {a: {}}\n")
	if doc, err := ValuesDocument(cm); err != nil || string(doc) != "os_images: {a: {}}\n" {
		t.Errorf("ConfigMap: %q %v", doc, err)
	}
	if _, err := ValuesDocument([]byte("kind: ConfigMap\ndata: {other: x}\n")); err == nil || !strings.Contains(err.Error(), "values.yaml") {
		t.Errorf("ConfigMap without values.yaml: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, k := range []string{"ubuntu-noble", "a1b"} {
		if ValidateKey(k) != nil {
			t.Errorf("key %q refused", k)
		}
	}
	for _, k := range []string{"Bad_Key", "ab", "-abc", "abc-", strings.Repeat("a", 54)} {
		if ValidateKey(k) == nil {
			t.Errorf("key %q accepted", k)
		}
	}
	if ValidateDigestField(FieldSHA256, strings.Repeat("a", 64)) != nil || ValidateDigestField(FieldSHA256, strings.Repeat("A", 64)) == nil ||
		ValidateDigestField(FieldMD5, strings.Repeat("0", 31)) == nil || ValidateDigestField(FieldOS, "anything") != nil {
		t.Error("digest validation")
	}
}
