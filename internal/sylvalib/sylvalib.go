// Package sylvalib runs the OS image selection of the real Sylva code, the
// named templates of the sylva-library Helm chart (templates/_os_images.tpl,
// as sylva-capi-cluster and sylva-units include them), through Helm's own
// template engine. Differential tests compare osimages with it: the library
// is the specification osimages is a drop-in replacement for.
//
// The library chart is read from its packaged .tgz (the shared fixtures
// hold sylva-library 0.9.0); nothing of it is copied into the project.
package sylvalib

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
)

// Library is a loaded sylva-library chart.
type Library struct {
	lib *chart.Chart
}

// Load reads the packaged library chart.
func Load(tgz string) (*Library, error) {
	lib, err := loader.LoadFile(tgz)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", tgz, err)
	}
	if lib.Metadata == nil || lib.Metadata.Name != "sylva-library" {
		return nil, fmt.Errorf("%s is not the sylva-library chart", tgz)
	}
	// Only the named templates are wanted: the library's own test template
	// renders an object from test values this caller does not pass.
	var keep []*common.File
	for _, f := range lib.Templates {
		if strings.HasSuffix(f.Name, ".tpl") {
			keep = append(keep, f)
		}
	}
	lib.Templates = keep
	return &Library{lib: lib}, nil
}

// Failure is a template's fail: the library refused the input, with its
// own message.
type Failure struct{ Message string }

func (f *Failure) Error() string { return f.Message }

// failure keeps the message of a fail, or the last line of another
// template error (a function called with a value of the wrong type): the
// lines before it only locate the call in the templates.
func failure(err error) *Failure {
	text := err.Error()
	if m := failRE.FindStringSubmatch(text); m != nil {
		return &Failure{Message: m[1]}
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	return &Failure{Message: strings.TrimSpace(lines[len(lines)-1])}
}

// PickOSImage runs pick-os-image on osImages (an os_images map as YAML
// decoding gives it) with one list of selectors, no fallback image key, and
// context for the messages: the image key picked, or the library's Failure.
func (l *Library) PickOSImage(osImages any, selectors []any, context string) (string, error) {
	return l.run(`{{ tuple .Values.os_images .Values.selectors "" .Values.context | include "pick-os-image" }}`,
		map[string]any{"os_images": osImages, "selectors": selectors, "context": context})
}

// SelectOSImages runs select-os-images: the sorted keys of the images of
// osImages that any of selectors matches.
func (l *Library) SelectOSImages(osImages any, selectors []any) ([]string, error) {
	out, err := l.run(`{{ tuple .Values.os_images .Values.selectors | include "select-os-images" | fromJson | keys | sortAlpha | toJson }}`,
		map[string]any{"os_images": osImages, "selectors": selectors})
	if err != nil {
		return nil, err
	}
	var keys []string
	if err := json.Unmarshal([]byte(out), &keys); err != nil {
		return nil, fmt.Errorf("select-os-images gave %q: %w", out, err)
	}
	return keys, nil
}

// levelTemplate merges the capm3 definitions of one level exactly as the
// library's find-cluster-image-selectors does (root <- control_plane, or
// root <- machine_deployment_default <- machine_deployments.NAME), then
// computes the level's image key with compute-image-key. The key is printed
// as JSON so that a key the library left empty, or unset, reads as such.
const levelTemplate = `
{{- $cv := .Values.cluster -}}
{{- $infra := "capm3" -}}
{{- $rootDef := ($cv | dig $infra dict) -}}
{{- $def := dict -}}
{{- if eq .Values.md "" -}}
  {{- $def = mergeOverwrite (deepCopy $rootDef) (deepCopy ($cv | dig "control_plane" $infra dict)) -}}
{{- else -}}
  {{- $mdDefaultDef := mergeOverwrite dict (deepCopy $rootDef) (deepCopy ($cv | dig "machine_deployment_default" $infra dict)) -}}
  {{- $mdDef := index $cv.machine_deployments .Values.md -}}
  {{- $def = mergeOverwrite dict (deepCopy $mdDefaultDef) (deepCopy ($mdDef | dig $infra dict)) -}}
{{- end -}}
{{- tuple $def $cv $cv.os_images .Values.context | include "compute-image-key" | toJson -}}
`

// LevelImageKey returns the image key that compute-image-key gives for one
// level of cluster values (sylva-capi-cluster's, holding os_images, k8s_version,
// capi_providers and the capm3 levels): md is the machine deployment's name,
// empty for the control plane. An empty key means the level designates no
// image through image_key or os_image_selector.
func (l *Library) LevelImageKey(cluster map[string]any, md, context string) (string, error) {
	out, err := l.run(levelTemplate, map[string]any{"cluster": cluster, "md": md, "context": context})
	if err != nil {
		return "", err
	}
	var key string
	if err := json.Unmarshal([]byte(out), &key); err != nil {
		return "", fmt.Errorf("compute-image-key gave %s: %w", out, err)
	}
	// A null image_key is printed by text/template as "<no value>", which
	// Helm removes from rendered files but not from an include's result.
	if key == "<no value>" {
		key = ""
	}
	return key, nil
}

const caseTemplate = "templates/case.txt"

// failRE finds the message of a template's fail in an engine error.
var failRE = regexp.MustCompile(`(?s)execution error at \([^)]*\): (.*)$`)

// run renders body in a throwaway chart that depends on the library, with
// vals as its values, exactly as `helm template` would.
func (l *Library) run(body string, vals map[string]any) (string, error) {
	parent := &chart.Chart{
		Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "sylvalib-case", Version: "0.0.0"},
		Templates: []*common.File{{
			Name: caseTemplate,
			Data: []byte(body),
		}},
	}
	parent.AddDependency(l.lib)
	top, err := util.ToRenderValues(parent, vals, common.ReleaseOptions{Name: "case", Namespace: "default", IsInstall: true}, nil)
	if err != nil {
		return "", fmt.Errorf("preparing the values: %w", err)
	}
	files, err := engine.Engine{}.Render(parent, top)
	if err != nil {
		return "", failure(err)
	}
	out, ok := files[parent.Name()+"/"+caseTemplate]
	if !ok {
		return "", errors.New("the case template was not rendered: " + strings.Join(slices.Sorted(maps.Keys(files)), ", "))
	}
	return out, nil
}
