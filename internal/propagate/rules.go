package propagate

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// Rule copies one source ConfigMap, under the name Target, into every
// namespace that Selector matches.
type Rule struct {
	Name     string
	Source   kube.ObjectKey
	Target   string
	Selector labels.Selector
	// Catalog, when set, makes the source a served set (contract §6) and
	// each copy only what its namespace can use: the entries whose sha256
	// the namespace's ConfigMap of this name (os-images-info) names, or
	// its osimages-status lists (see filter.go). "" copies the source
	// whole.
	Catalog string
}

// Names of Sylva's rule, the default one (contract §7).
const (
	DefaultRuleName   = "os-image-server-images"
	DefaultTargetName = "kyverno-cloned-os-image-server-images"
	// WorkloadClusterLabel marks the namespaces of workload clusters.
	WorkloadClusterLabel = "sylva-project.org/workload-cluster"
)

// DefaultRules is Sylva's rule: the served-images ConfigMap copied into
// every workload-cluster namespace, under the name the Kyverno policy gave
// it, so that consumers of the copy need no change; each copy holds the
// entries its namespace's os-images-info can pick.
func DefaultRules() []Rule {
	return []Rule{{
		Name:     DefaultRuleName,
		Source:   kube.ObjectKey{Namespace: osimage.ServedConfigMapNamespace, Name: osimage.ServedConfigMapName},
		Target:   DefaultTargetName,
		Selector: labels.SelectorFromSet(labels.Set{WorkloadClusterLabel: ""}),
		Catalog:  osimage.InfoConfigMapName,
	}}
}

// fileRule is a rule as written in the rules file.
type fileRule struct {
	Name              string                `json:"name"`
	Source            string                `json:"source"`
	Target            string                `json:"target"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector"`
	Catalog           string                `json:"catalog"`
}

type fileConfig struct {
	Rules []fileRule `json:"rules"`
}

// LoadRules reads a rules file. Every problem found is reported, each
// naming the file and the rule.
func LoadRules(path string) ([]Rule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading rules: %w", err)
	}
	rules, err := ParseRules(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rules, nil
}

// ParseRules reads the YAML of a rules file:
//
//	rules:
//	- name: os-image-server-images
//	  source: sylva-system/capm3-os-image-server-os-images
//	  target: kyverno-cloned-os-image-server-images
//	  namespaceSelector:
//	    matchLabels: {sylva-project.org/workload-cluster: ""}
//	  catalog: os-images-info   # optional: copy only what this catalog can pick
func ParseRules(data []byte) ([]Rule, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("no rules: the file is empty")
	}
	var fc fileConfig
	// Strict, so that a misspelt key (namespaceSelectors) is an error rather
	// than a rule that silently matches nothing.
	if err := yaml.UnmarshalStrict(data, &fc); err != nil {
		return nil, fmt.Errorf("parsing rules: %w", err)
	}
	if len(fc.Rules) == 0 {
		return nil, errors.New("no rules: .rules is empty")
	}
	var errs []error
	rules := make([]Rule, 0, len(fc.Rules))
	names := map[string]int{}
	targets := map[string]string{}
	for i, fr := range fc.Rules {
		ctx := fmt.Sprintf(".rules[%d]", i)
		if fr.Name != "" {
			ctx = fmt.Sprintf(".rules[%d] (%s)", i, fr.Name)
		}
		r, ruleErrs := parseRule(fr)
		for _, err := range ruleErrs {
			errs = append(errs, fmt.Errorf("%s: %w", ctx, err))
		}
		if len(ruleErrs) > 0 {
			continue
		}
		if j, dup := names[r.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: name %q is already used by .rules[%d]", ctx, r.Name, j))
			continue
		}
		names[r.Name] = i
		// Two rules writing the same name would take turns overwriting
		// each other's copies wherever their selectors overlap.
		if other, dup := targets[r.Target]; dup {
			errs = append(errs, fmt.Errorf("%s: target %q is already written by rule %q", ctx, r.Target, other))
			continue
		}
		targets[r.Target] = r.Name
		rules = append(rules, r)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return rules, nil
}

func parseRule(fr fileRule) (Rule, []error) {
	var errs []error
	// The rule and source names go into label values on every copy.
	if fr.Name == "" {
		errs = append(errs, errors.New("name is required"))
	} else if msgs := validation.IsValidLabelValue(fr.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("name %q must be a valid label value: %s", fr.Name, msgs[0]))
	}
	// ParseObjectKey checks the namespace and the name as the apiserver
	// would.
	src, err := kube.ParseObjectKey(fr.Source)
	if err != nil {
		errs = append(errs, fmt.Errorf("source: %w", err))
	} else if msgs := validation.IsValidLabelValue(src.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("source name %q must fit in a label value, copies carry it: %s", src.Name, msgs[0]))
	}
	if fr.Target == "" {
		errs = append(errs, errors.New("target is required"))
	} else if msgs := validation.IsDNS1123Subdomain(fr.Target); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("target %q is not a valid ConfigMap name: %s", fr.Target, msgs[0]))
	}
	if fr.Catalog != "" {
		if msgs := validation.IsDNS1123Subdomain(fr.Catalog); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("catalog %q is not a valid ConfigMap name: %s", fr.Catalog, msgs[0]))
		} else if fr.Catalog == fr.Target {
			errs = append(errs, fmt.Errorf("catalog %q is the target: a copy cannot be cut down by itself (the catalog is the namespace's os-images-info)", fr.Catalog))
		}
	}
	var sel labels.Selector
	if fr.NamespaceSelector == nil {
		// A missing selector is more likely an omission than a wish to
		// copy into kube-system and every other namespace.
		errs = append(errs, errors.New("namespaceSelector is required (write {} to select every namespace)"))
	} else if sel, err = metav1.LabelSelectorAsSelector(fr.NamespaceSelector); err != nil {
		errs = append(errs, fmt.Errorf("namespaceSelector: %w", err))
	}
	if len(errs) > 0 {
		return Rule{}, errs
	}
	return Rule{Name: fr.Name, Source: src, Target: fr.Target, Selector: sel, Catalog: fr.Catalog}, nil
}

// LoadRulesOrDefault reads the rules file path, or returns Sylva's one
// rule when path is "".
func LoadRulesOrDefault(path string) ([]Rule, error) {
	if path == "" {
		return DefaultRules(), nil
	}
	return LoadRules(path)
}
