// Package values loads Helm-style values files: several -f files merged in
// order, later wins, and {{ .Values.x }} references resolved against the
// merged result.
package values

import (
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// Values is a merged values tree, as YAML decodes it.
type Values = map[string]any

// LoadFiles reads each file and merges them in order, as `helm -f a -f b`
// does: maps merge key by key, any other value of a later file replaces the
// earlier one, and a null removes the key.
func LoadFiles(paths ...string) (Values, error) {
	merged := Values{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reading values file: %w", err)
		}
		v, err := Parse(data)
		if err != nil {
			return nil, fmt.Errorf("values file %s: %w", p, err)
		}
		merged = Merge(merged, v)
	}
	return merged, nil
}

// Parse decodes one YAML values document. An empty document is an empty map.
func Parse(data []byte) (Values, error) {
	v := Values{}
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("not a YAML map: %w", err)
	}
	return v, nil
}

// Merge returns base with override deep-merged over it. Neither input is
// modified.
func Merge(base, override Values) Values {
	out := make(Values, len(base)+len(override))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range override {
		if v == nil {
			delete(out, k)
			continue
		}
		bm, bok := out[k].(map[string]any)
		om, ook := v.(map[string]any)
		if bok && ook {
			out[k] = Merge(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}

// Map returns the map at key, an empty map when key is absent, or an error
// naming path when the value is something else.
func Map(v Values, key, path string) (Values, error) {
	raw, ok := v[key]
	if !ok || raw == nil {
		return Values{}, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: must be a map, got %s", path, describe(raw))
	}
	return m, nil
}

// String returns the scalar at key as a string ("" when absent), or an error
// naming path when it is a map or a list.
func String(v Values, key, path string) (string, error) {
	switch t := v[key].(type) {
	case nil:
		return "", nil
	case string:
		return t, nil
	case bool, float64, int, int64:
		return fmt.Sprint(t), nil
	default:
		return "", fmt.Errorf("%s: must be a string, got %s", path, describe(t))
	}
}

// Bool returns the value at key as a boolean (def when absent). The strings
// "true" and "false" are accepted too, as Helm users often quote them.
func Bool(v Values, key, path string, def bool) (bool, error) {
	switch t := v[key].(type) {
	case nil:
		return def, nil
	case bool:
		return t, nil
	case string:
		switch strings.ToLower(t) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
	}
	return false, fmt.Errorf("%s: must be true or false, got %s", path, describe(v[key]))
}

func describe(v any) string {
	switch t := v.(type) {
	case map[string]any:
		return "a map"
	case []any:
		return "a list"
	case string:
		return fmt.Sprintf("%q", t)
	default:
		return fmt.Sprintf("%v", t)
	}
}
