package values

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadFilesMergesInOrder(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.yaml")
	b := filepath.Join(dir, "b.yaml")
	os.WriteFile(a, []byte("x: 1\nm: {keep: a, over: a, gone: a}\nlist: [1, 2]\n"), 0o600)
	os.WriteFile(b, []byte("m: {over: b, gone: null, new: b}\nlist: [3]\n"), 0o600)
	v, err := LoadFiles(a, b)
	if err != nil {
		t.Fatal(err)
	}
	m := v["m"].(map[string]any)
	if m["keep"] != "a" || m["over"] != "b" || m["new"] != "b" {
		t.Errorf("deep merge: %v", m)
	}
	if _, ok := m["gone"]; ok {
		t.Error("a null did not remove the key")
	}
	if l := v["list"].([]any); len(l) != 1 {
		t.Errorf("lists are replaced, not merged: %v", l)
	}
	if _, err := LoadFiles(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v", err)
	}
	os.WriteFile(a, []byte("- a list\n"), 0o600)
	if _, err := LoadFiles(a); err == nil || !strings.Contains(err.Error(), a) {
		t.Errorf("a file that is not a map: %v", err)
	}
}

func TestRender(t *testing.T) {
	render := func(s string, v Values, path string) (string, error) {
		return NewRenderer(context.Background(), v).Render(s, path)
	}
	v := Values{"base": "oci://r/{{ .Values.project }}", "project": "sylva", "nested": map[string]any{"tag": "0.7.6"}}
	got, err := render("{{ .Values.base }}/dib:{{ .Values.nested.tag }}", v, "p")
	if err != nil || got != "oci://r/sylva/dib:0.7.6" {
		t.Errorf("got %q, %v", got, err)
	}
	if _, err := render("{{ .Values.nope }}", v, "os_images_oci_registries.x.url"); err == nil || !strings.Contains(err.Error(), "os_images_oci_registries.x.url: cannot resolve") {
		t.Errorf("missing value: %v", err)
	}
	if _, err := render("{{ .Values.a }}", Values{"a": "{{ .Values.a }}"}, "p"); err == nil || !strings.Contains(err.Error(), "refers to itself") {
		t.Errorf("self reference: %v", err)
	}
	if s, err := render("plain", nil, "p"); err != nil || s != "plain" {
		t.Errorf("no template: %q %v", s, err)
	}
}

func TestAccessors(t *testing.T) {
	v := Values{"s": "x", "n": 3, "b": "true", "m": map[string]any{}, "l": []any{}}
	if s, err := String(v, "n", ".n"); err != nil || s != "3" {
		t.Errorf("number as string: %q %v", s, err)
	}
	if _, err := String(v, "m", ".m"); err == nil || !strings.Contains(err.Error(), ".m: must be a string, got a map") {
		t.Errorf("map as string: %v", err)
	}
	if b, err := Bool(v, "b", ".b", false); err != nil || !b {
		t.Errorf("quoted boolean: %v %v", b, err)
	}
	if b, err := Bool(v, "absent", ".absent", true); err != nil || !b {
		t.Errorf("default: %v %v", b, err)
	}
	if _, err := Map(v, "l", ".l"); err == nil || !strings.Contains(err.Error(), ".l: must be a map, got a list") {
		t.Errorf("list as map: %v", err)
	}
}
