package values

import (
	"reflect"
	"strings"
	"testing"
)

// Overlay merges maps key by key and replaces anything else, keeping a
// null as a value, where Merge removes the key.
func TestOverlayKeepsANullMergeRemoves(t *testing.T) {
	base := Values{
		"sel":  map[string]any{"os": "ubuntu", "k8s-flavor": "rke2"},
		"list": []any{"a", "b"},
		"key":  "base",
	}
	over := Values{
		"sel":  map[string]any{"os": nil, "hardened": "true"},
		"list": []any{"c"},
		"key":  nil,
	}
	got := Overlay(base, over)
	want := Values{
		"sel":  map[string]any{"os": nil, "k8s-flavor": "rke2", "hardened": "true"},
		"list": []any{"c"},
		"key":  nil,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Overlay: %v, want %v", got, want)
	}
	merged := Merge(base, over)
	if _, ok := merged["key"]; ok {
		t.Errorf("Merge kept a null: %v", merged)
	}
	if sel := merged["sel"].(map[string]any); sel["k8s-flavor"] != "rke2" || sel["hardened"] != "true" {
		t.Errorf("Merge of maps: %v", sel)
	}
	if _, ok := merged["sel"].(map[string]any)["os"]; ok {
		t.Errorf("Merge kept a nested null: %v", merged["sel"])
	}
}

// A map over a scalar, or a scalar over a map, replaces it whole.
func TestOverlayReplacesAcrossKinds(t *testing.T) {
	got := Overlay(Values{"a": "text", "b": map[string]any{"x": 1}}, Values{"a": map[string]any{"y": 2}, "b": "text"})
	if !reflect.DeepEqual(got, Values{"a": map[string]any{"y": 2}, "b": "text"}) {
		t.Errorf("got %v", got)
	}
}

// The result of Overlay shares nothing with its inputs, nor does a
// DeepCopy with its original: editing one never reaches the other, at
// any depth, in maps or in lists.
func TestOverlayAndDeepCopyShareNothing(t *testing.T) {
	base := Values{"m": map[string]any{"inner": map[string]any{"x": "base"}}, "l": []any{map[string]any{"y": "base"}}}
	over := Values{"o": map[string]any{"z": "over"}}
	out := Overlay(base, over)
	out["m"].(map[string]any)["inner"].(map[string]any)["x"] = "edited"
	out["l"].([]any)[0].(map[string]any)["y"] = "edited"
	out["o"].(map[string]any)["z"] = "edited"
	if base["m"].(map[string]any)["inner"].(map[string]any)["x"] != "base" || base["l"].([]any)[0].(map[string]any)["y"] != "base" {
		t.Errorf("editing the result changed base: %v", base)
	}
	if over["o"].(map[string]any)["z"] != "over" {
		t.Errorf("editing the result changed over: %v", over)
	}

	orig := map[string]any{"l": []any{[]any{"deep"}}, "n": 1.5, "s": "x", "b": true, "null": nil}
	cp := DeepCopy(orig).(map[string]any)
	if !reflect.DeepEqual(cp, orig) {
		t.Fatalf("copy %v differs from %v", cp, orig)
	}
	cp["l"].([]any)[0].([]any)[0] = "edited"
	if orig["l"].([]any)[0].([]any)[0] != "deep" {
		t.Error("editing the copy's nested list changed the original")
	}
	if DeepCopy(nil) != nil || DeepCopy("s") != "s" {
		t.Error("a scalar is not returned as is")
	}
}

// Merge modifies neither input.
func TestMergeLeavesItsInputs(t *testing.T) {
	base := Values{"m": map[string]any{"a": "1", "b": "2"}}
	over := Values{"m": map[string]any{"b": nil, "c": "3"}}
	Merge(base, over)
	if !reflect.DeepEqual(base, Values{"m": map[string]any{"a": "1", "b": "2"}}) || !reflect.DeepEqual(over, Values{"m": map[string]any{"b": nil, "c": "3"}}) {
		t.Errorf("inputs changed: %v %v", base, over)
	}
}

func TestParse(t *testing.T) {
	for _, empty := range []string{"", "\n", "# only a comment\n", "{}"} {
		v, err := Parse([]byte(empty))
		if err != nil || v == nil || len(v) != 0 {
			t.Errorf("%q: %v, %v; want an empty map", empty, v, err)
		}
	}
	for _, bad := range []string{"- a\n- b\n", "just a string", "a: [\n"} {
		if _, err := Parse([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "not a YAML map") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestAccessorsTable(t *testing.T) {
	v := Values{"t": true, "f": false, "T": "TRUE", "F": "False", "yes": "yes", "one": 1.0, "null": nil, "l": []any{1}, "m": map[string]any{"k": "v"}}
	for _, c := range []struct {
		key  string
		def  bool
		want bool
		err  string
	}{
		{"t", false, true, ""}, {"f", true, false, ""}, {"T", false, true, ""}, {"F", true, false, ""},
		{"absent", true, true, ""}, {"null", true, true, ""},
		{"yes", false, false, `.yes: must be true or false, got "yes"`},
		{"one", false, false, ".one: must be true or false, got 1"},
		{"l", false, false, ".l: must be true or false, got a list"},
	} {
		got, err := Bool(v, c.key, "."+c.key, c.def)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("Bool %s: %v, want %q", c.key, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Bool %s: %v, %v; want %v", c.key, got, err, c.want)
		}
	}
	for key, want := range map[string]string{"t": "true", "one": "1", "absent": "", "null": "", "m": "", "l": ""} {
		got, err := String(v, key, "."+key)
		switch key {
		case "m", "l":
			if err == nil || !strings.HasPrefix(err.Error(), "."+key+": must be a string, got a ") {
				t.Errorf("String %s: %v", key, err)
			}
		default:
			if err != nil || got != want {
				t.Errorf("String %s: %q, %v; want %q", key, got, err, want)
			}
		}
	}
	if m, err := Map(v, "null", ".null"); err != nil || m == nil || len(m) != 0 {
		t.Errorf("Map of a null: %v, %v; want an empty map", m, err)
	}
	if m, err := Map(v, "m", ".m"); err != nil || m["k"] != "v" {
		t.Errorf("Map: %v, %v", m, err)
	}
	if _, err := Map(v, "T", ".T"); err == nil || err.Error() != `.T: must be a map, got "TRUE"` {
		t.Errorf("Map of a string: %v", err)
	}
}
