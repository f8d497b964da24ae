package propagate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

func TestDefaultRulesAreSylvas(t *testing.T) {
	rules := DefaultRules()
	if len(rules) != 1 {
		t.Fatalf("%d rules", len(rules))
	}
	r := rules[0]
	if r.Source.String() != "sylva-system/capm3-os-image-server-os-images" || r.Target != "kyverno-cloned-os-image-server-images" || r.Catalog != "os-images-info" {
		t.Errorf("rule %+v", r)
	}
	if !r.Selector.Matches(labels.Set{"sylva-project.org/workload-cluster": ""}) {
		t.Error("does not match a workload-cluster namespace")
	}
	if r.Selector.Matches(labels.Set{"sylva-project.org/workload-cluster": "yes"}) || r.Selector.Matches(labels.Set{}) {
		t.Error("matches more than the label with the empty value")
	}
}

func TestParseRules(t *testing.T) {
	rules, err := ParseRules([]byte(`
rules:
- name: os-images
  source: sylva-system/capm3-os-image-server-os-images
  target: kyverno-cloned-os-image-server-images
  namespaceSelector:
    matchLabels: {sylva-project.org/workload-cluster: ""}
  catalog: os-images-info
- name: mgmt-state
  source: sylva-system/mgmt-cluster-state-values
  target: kyverno-cloned-mgmt-cluster-state-values
  namespaceSelector:
    matchExpressions:
    - {key: sylva-project.org/workload-cluster, operator: Exists}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 2 || rules[1].Name != "mgmt-state" || rules[1].Source.Name != "mgmt-cluster-state-values" || rules[0].Catalog != "os-images-info" || rules[1].Catalog != "" {
		t.Fatalf("rules %+v", rules)
	}
	if !rules[1].Selector.Matches(labels.Set{"sylva-project.org/workload-cluster": "x"}) || rules[1].Selector.Matches(labels.Set{}) {
		t.Error("matchExpressions not honoured")
	}
}

func TestParseRulesErrors(t *testing.T) {
	const ok = `  source: a/b
  target: c
  namespaceSelector: {}
`
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"empty file", "", []string{"the file is empty"}},
		{"no rules", "rules: []", []string{".rules is empty"}},
		{"not YAML", "rules: [", []string{"parsing rules"}},
		{"unknown key", "rules:\n- name: a\n  namespaceSelectors: {}\n" + ok, []string{`unknown field "namespaceSelectors"`}},
		{"no name", "rules:\n-" + ok[1:], []string{".rules[0]: name is required"}},
		{"name not a label value", "rules:\n- name: 'a b'\n" + ok, []string{`.rules[0] (a b): name "a b" must be a valid label value`}},
		{"source without namespace", "rules:\n- name: a\n  source: b\n  target: c\n  namespaceSelector: {}\n", []string{`.rules[0] (a): source: "b": want NAMESPACE/NAME`}},
		{"source name too long for a label", "rules:\n- name: a\n  source: ns/" + strings.Repeat("x", 64) + "\n  target: c\n  namespaceSelector: {}\n", []string{"must fit in a label value"}},
		{"source namespace invalid", "rules:\n- name: a\n  source: Bad_NS/b\n  target: c\n  namespaceSelector: {}\n", []string{`source: "Bad_NS/b": want NAMESPACE/NAME: namespace "Bad_NS"`}},
		{"no target", "rules:\n- name: a\n  source: a/b\n  namespaceSelector: {}\n", []string{".rules[0] (a): target is required"}},
		{"target invalid", "rules:\n- name: a\n  source: a/b\n  target: Not/Valid\n  namespaceSelector: {}\n", []string{`target "Not/Valid" is not a valid ConfigMap name`}},
		{"no selector", "rules:\n- name: a\n  source: a/b\n  target: c\n", []string{"namespaceSelector is required (write {} to select every namespace)"}},
		{"bad selector", "rules:\n- name: a\n  source: a/b\n  target: c\n  namespaceSelector: {matchExpressions: [{key: k, operator: Sometimes}]}\n", []string{"namespaceSelector:", `"Sometimes" is not a valid label selector operator`}},
		{"catalog invalid", "rules:\n- name: a\n  catalog: Not/Valid\n" + ok, []string{`.rules[0] (a): catalog "Not/Valid" is not a valid ConfigMap name`}},
		{"catalog is the target", "rules:\n- name: a\n  catalog: c\n" + ok, []string{`.rules[0] (a): catalog "c" is the target`}},
		{"duplicate names", "rules:\n- name: a\n" + ok + "- name: a\n  source: a/b\n  target: d\n  namespaceSelector: {}\n", []string{`.rules[1] (a): name "a" is already used by .rules[0]`}},
		{"duplicate targets", "rules:\n- name: a\n" + ok + "- name: b\n" + ok, []string{`.rules[1] (b): target "c" is already written by rule "a"`}},
		{"every problem reported", "rules:\n- name: a\n  source: x\n- name: b\n  target: c\n", []string{
			".rules[0] (a): source:", ".rules[0] (a): target is required", ".rules[0] (a): namespaceSelector is required",
			".rules[1] (b): source:", ".rules[1] (b): namespaceSelector is required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRules([]byte(tt.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not say %q", err, w)
				}
			}
		})
	}
}

func TestLoadRulesNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("rules: []"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadRules(path); err == nil || !strings.Contains(err.Error(), path+": no rules") {
		t.Errorf("error %v", err)
	}
	if _, err := LoadRules(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("error %v", err)
	}
}
