package chart

import (
	"testing"

	"github.com/sylva-projects/osimages/internal/propagate"
)

// TestPropagationRulesCatalog: the rules the chart writes filter the copies
// of the served set by each namespace's os-images-info unless told not
// to, and osimages reads them as the chart meant.
func TestPropagationRulesCatalog(t *testing.T) {
	tests := []struct {
		values string
		want   []string // the Catalog of each rule
	}{
		{"", []string{"os-images-info"}},
		{`propagation: {catalog: ""}`, []string{""}},
		{`propagation: {catalog: my-catalog, extraRules: [{name: state, source: sylva-system/state, target: state-copy, namespaceSelector: {}}, {name: more, source: a/b, target: c, namespaceSelector: {}, catalog: os-images-info}]}`,
			[]string{"my-catalog", "", "os-images-info"}},
	}
	for _, tt := range tests {
		vals, err := LoadValues([]byte(tt.values))
		if err != nil {
			t.Fatal(err)
		}
		r, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, vals)
		if err != nil {
			t.Fatalf("%q: %v", tt.values, err)
		}
		cm := r.Find("ConfigMap", "osimages-rules")
		if cm == nil {
			t.Fatalf("%q: no rules ConfigMap", tt.values)
		}
		data, _, _ := unstructuredString(cm.Object, "data", "rules.yaml")
		rules, err := propagate.ParseRules([]byte(data))
		if err != nil {
			t.Fatalf("%q: the chart's rules do not parse: %v\n%s", tt.values, err, data)
		}
		if len(rules) != len(tt.want) {
			t.Fatalf("%q: %d rules, want %d", tt.values, len(rules), len(tt.want))
		}
		for i, r := range rules {
			if r.Catalog != tt.want[i] {
				t.Errorf("%q: rule %s filters by %q, want %q", tt.values, r.Name, r.Catalog, tt.want[i])
			}
		}
	}
	vals, err := LoadValues([]byte(`propagation: {catalog: "Not A Name"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, vals); err == nil {
		t.Error("the schema takes a catalog that is no ConfigMap name")
	}
}
