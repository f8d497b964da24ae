// Package chart renders the osimages Helm chart (charts/osimages) through
// Helm's own Go library, exactly as `helm install` does before it talks to the
// cluster: values coalesced with the chart's defaults, checked against
// values.schema.json, templates rendered. Tests use it to apply what the chart
// would install to a real apiserver.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Release names the release being rendered.
type Release struct {
	Name, Namespace string
}

// KubeVersion is the Kubernetes version the chart is rendered for: the
// envtest apiserver's (hack/tools/envtest), which the tests apply it to.
const KubeVersion = "v1.37.2"

// Rendered is the output of one render.
type Rendered struct {
	// Objects are the rendered objects, in template file order.
	Objects []*unstructured.Unstructured
	// Files maps a template path to its rendered text (empty ones left out).
	Files map[string]string
}

// Render renders the chart in dir for rel with vals over the chart's
// defaults. A value that breaks values.schema.json fails with Helm's message,
// which names the path of the value and what the schema wants.
func Render(dir string, rel Release, vals map[string]any) (*Rendered, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", dir, err)
	}
	if vals == nil {
		vals = map[string]any{}
	}
	caps := common.DefaultCapabilities.Copy()
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = *kv
	top, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{
		Name: rel.Name, Namespace: rel.Namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	// Strict: a template that reads a value the chart does not define is a
	// bug of the chart, not an empty string.
	files, err := engine.Engine{Strict: true}.Render(ch, top)
	if err != nil {
		return nil, err
	}
	out := &Rendered{Files: map[string]string{}}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		base := path.Base(name)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" || strings.TrimSpace(files[name]) == "" {
			continue
		}
		out.Files[name] = files[name]
		objs, err := decode(files[name])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out.Objects = append(out.Objects, objs...)
	}
	return out, nil
}

// LoadValues reads a values document, for variants kept as files.
func LoadValues(doc []byte) (map[string]any, error) {
	vals := map[string]any{}
	if err := yaml.Unmarshal(doc, &vals); err != nil {
		return nil, err
	}
	return vals, nil
}

func decode(text string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(text)), 4096)
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document %d has no kind or apiVersion", i)
		}
		objs = append(objs, u)
	}
}

// Find returns the rendered object of that kind and name, or nil.
func (r *Rendered) Find(kind, name string) *unstructured.Unstructured {
	for _, o := range r.Objects {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}
