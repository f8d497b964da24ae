package capm3

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The real CAPM3 CRD lives outside the module; the project must test
// without it, so this check runs only where it is present.
const crdPath = "/work/shared/crds/metal3/infrastructure.cluster.x-k8s.io_metal3machinetemplates.yaml"

// TestRenderMatchesCRD checks rendered objects against the CRD's schema:
// every field known at its place, of its type, within its enum, with the
// required fields present. It is a small subset of what the API server
// checks, enough to catch a field put at the wrong level or version.
func TestRenderMatchesCRD(t *testing.T) {
	data, err := os.ReadFile(crdPath)
	if err != nil {
		t.Skipf("CRD not available: %v", err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	extra := map[string]string{
		V1Beta1: `
control_plane:
  capm3:
    nodeReuse: true
    dataTemplate: {name: dt, kind: Metal3DataTemplate, apiVersion: infrastructure.cluster.x-k8s.io/v1beta1}
    hostSelector: {matchLabels: {role: cp}, matchExpressions: [{key: rack, operator: In, values: ["1"]}]}
`,
		V1Beta2: `
control_plane:
  capm3:
    nodeReuse: true
    dataTemplate: {name: dt, namespace: ns}
    hostSelector: {matchLabels: {role: cp}, matchExpressions: [{key: rack, operator: In, values: ["1"]}]}
machine_deployments:
  md2:
    capm3: {os_image_selector: null, machine_image_url: "https://x.example/y.qcow2", machine_image_checksum: "` + strings.Repeat("0", 32) + `", machine_image_format: qcow2}
`,
	}
	for _, v := range crd.Spec.Versions {
		apiVersion := Group + "/" + v.Name
		t.Run(v.Name, func(t *testing.T) {
			ts, _ := render(t, Input{Values: vals(t, extra[apiVersion]), Catalog: testCatalog(), Served: servedAll(), APIVersion: apiVersion, Namespace: "ns"})
			for _, tpl := range ts {
				for _, e := range checkSchema(v.Schema.OpenAPIV3Schema, tpl.Object, "") {
					t.Errorf("%s: %s", tpl.Level, e)
				}
			}
		})
	}
}

func checkSchema(schema map[string]any, v any, path string) []string {
	var errs []string
	if enum, ok := schema["enum"].([]any); ok {
		found := false
		for _, e := range enum {
			if e == v {
				found = true
			}
		}
		if !found {
			errs = append(errs, fmt.Sprintf("%s: %v is not in %v", path, v, enum))
		}
	}
	switch schema["type"] {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return append(errs, fmt.Sprintf("%s: want an object, got %T", path, v))
		}
		props, _ := schema["properties"].(map[string]any)
		addl, _ := schema["additionalProperties"].(map[string]any)
		for k, fv := range m {
			sub, ok := props[k].(map[string]any)
			if !ok {
				sub = addl
			}
			if sub == nil {
				// An object schema without properties (metadata) is
				// checked by the API server itself.
				if props != nil {
					errs = append(errs, fmt.Sprintf("%s.%s: unknown field", path, k))
				}
				continue
			}
			errs = append(errs, checkSchema(sub, fv, path+"."+k)...)
		}
		req, _ := schema["required"].([]any)
		for _, r := range req {
			if _, ok := m[r.(string)]; !ok {
				errs = append(errs, fmt.Sprintf("%s: required field %s missing", path, r))
			}
		}
	case "array":
		l, ok := v.([]any)
		if !ok {
			return append(errs, fmt.Sprintf("%s: want an array, got %T", path, v))
		}
		items, _ := schema["items"].(map[string]any)
		for i, e := range l {
			errs = append(errs, checkSchema(items, e, fmt.Sprintf("%s[%d]", path, i))...)
		}
	case "string":
		if _, ok := v.(string); !ok {
			errs = append(errs, fmt.Sprintf("%s: want a string, got %T", path, v))
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			errs = append(errs, fmt.Sprintf("%s: want a boolean, got %T", path, v))
		}
	}
	return errs
}
