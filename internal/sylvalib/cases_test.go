package sylvalib_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Mode says which part of the selection a case exercises.
type Mode string

const (
	// ModePick picks the one image a selector designates: `osimages select
	// --selector` against the library's pick-os-image.
	ModePick Mode = "pick"
	// ModeList lists the images any selector of a list matches, as the
	// image server's additional selectors do: against select-os-images.
	ModeList Mode = "list"
	// ModeLevel picks the image of one level of cluster values, merged and
	// finalized: `osimages select --cluster-values --level` (and render)
	// against the library's level merge and compute-image-key.
	ModeLevel Mode = "level"
)

// Case is one input given to both osimages and the library. Documents are
// YAML text, decoded once by each side as it would be in production.
type Case struct {
	Name string
	Mode Mode
	// OSImages is the os_images map (ModePick, ModeList).
	OSImages string
	// Selectors are YAML selectors: one for ModePick, any for ModeList.
	Selectors []string
	// Cluster is the cluster values, os_images included (ModeLevel).
	Cluster string
	// Overrides are more values files given after Cluster, as `helm -f
	// cluster.yaml -f override.yaml` (ModeLevel).
	Overrides []string
	// MD names the machine deployment of a ModeLevel case, empty for the
	// control plane.
	MD string
}

// Level is the values path of a ModeLevel case.
func (c Case) Level() string {
	if c.MD == "" {
		return ".control_plane.capm3"
	}
	return ".machine_deployments." + c.MD + ".capm3"
}

func (c Case) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s [%s]", c.Name, c.Mode)
	switch c.Mode {
	case ModeLevel:
		fmt.Fprintf(&b, " level %s\n  cluster values: %s", c.Level(), c.Cluster)
		for _, o := range c.Overrides {
			fmt.Fprintf(&b, "\n  then: %s", o)
		}
	default:
		fmt.Fprintf(&b, "\n  selectors: %s\n  os_images: %s", strings.Join(c.Selectors, " | "), c.OSImages)
	}
	return b.String()
}

// decode reads YAML as both sides do (sigs.k8s.io/yaml, as Helm's values
// loader).
func decode(doc string) (any, error) {
	var v any
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		return nil, err
	}
	return v, nil
}

func toYAML(v any) string {
	out, err := yaml.Marshal(v)
	if err != nil {
		panic(err)
	}
	return strings.TrimSpace(string(out))
}

// flow is a one-line YAML map or list, for case inputs written by hand.
func flow(s string) string { return strings.TrimSpace(s) }

// The catalog of the hand-written cases.
const handCatalog = `{
  ubuntu-noble-plain-rke2-1-32: {os: ubuntu, os-release: noble, hardened: "false", flavor: plain, k8s-flavor: rke2, k8s-version: 1.32.5+rke2r1, oci-image-registry-key: sylva, commit-tag: 0.7.6},
  ubuntu-noble-hardened-rke2-1-32: {os: ubuntu, os-release: noble, hardened: "true", flavor: hardened, k8s-flavor: rke2, k8s-version: 1.32.5+rke2r1, oci-image-registry-key: sylva, commit-tag: 0.7.6},
  opensuse-15-6-plain-rke2-1-32: {os: opensuse, os-release: "15.6", hardened: "false", flavor: plain, k8s-flavor: rke2, k8s-version: 1.32.5+rke2r1, oci-image-registry-key: sylva, commit-tag: 0.7.6},
  ubuntu-noble-plain-kubeadm-1-32: {os: ubuntu, os-release: noble, hardened: "false", flavor: plain, k8s-flavor: kubeadm, k8s-version: 1.32.5, oci-image-registry-key: sylva},
  my-image: {os: ubuntu, os-release: noble, k8s-flavor: rke2, k8s-version: 1.32.5+rke2r1, uri: "https://files.example.org/my.raw"}
}`

// handCases are the cases of issue 13, the selector table tests of
// osimages (internal/selector, internal/capm3) and the library's own test
// data, written as inputs to both sides.
func handCases() []Case {
	var cs []Case
	pick := func(name, images, sel string) {
		cs = append(cs, Case{Name: name, Mode: ModePick, OSImages: flow(images), Selectors: []string{flow(sel)}})
	}
	list := func(name, images string, sels ...string) {
		cs = append(cs, Case{Name: name, Mode: ModeList, OSImages: flow(images), Selectors: sels})
	}
	level := func(name, cluster string, mds ...string) {
		if len(mds) == 0 {
			mds = []string{""}
		}
		for _, md := range mds {
			cs = append(cs, Case{Name: name, Mode: ModeLevel, Cluster: cluster, MD: md})
		}
	}
	cluster := func(capm3 string, extra ...string) string {
		return strings.Join(append([]string{
			"name: c1", "k8s_version: v1.32.5+rke2r1",
			"capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}",
			"os_images: " + strings.ReplaceAll(handCatalog, "\n", " "),
			"capm3: " + capm3,
		}, extra...), "\n")
	}

	// Issue 13, section 1: an empty selector is unset.
	level("empty selector with image_key", cluster(`{os_image_selector: {}, image_key: my-image}`))
	level("empty selector alone", cluster(`{os_image_selector: {}}`))
	level("false selector with image_key", cluster(`{os_image_selector: false, image_key: my-image}`))
	level("null selector with image_key", cluster(`{os_image_selector: null, image_key: my-image}`))
	level("empty selector over a root selector is a no-op merge", cluster(`{os_image_selector: {os: opensuse}}`, `control_plane: {capm3: {os_image_selector: {}}}`))
	level("false selector unsets the root selector", cluster(`{os_image_selector: {os: opensuse}}`, `control_plane: {capm3: {os_image_selector: false, image_key: my-image}}`))
	level("null selector unsets the root selector", cluster(`{os_image_selector: {os: opensuse}}`, `control_plane: {capm3: {os_image_selector: null, image_key: my-image}}`))
	level("empty selector in a machine deployment", cluster(`{image_key: my-image}`,
		`machine_deployment_default: {capm3: {os_image_selector: {}}}`,
		`machine_deployments: {md0: {capm3: {os_image_selector: {}}}, md1: {capm3: {os_image_selector: false}}, md2: {capm3: {os_image_selector: {os: opensuse}, image_key: null}}}`), "md0", "md1", "md2")
	level("empty string selector", cluster(`{os_image_selector: "", image_key: my-image}`))
	level("null pattern after the level merge", cluster(`{os_image_selector: {os: opensuse, hardened: "false"}}`, `control_plane: {capm3: {os_image_selector: {hardened: null}}}`))
	cs = append(cs, Case{Name: "null in a later values file", Mode: ModeLevel,
		Cluster:   cluster(`{os_image_selector: {os: opensuse, hardened: "false"}}`),
		Overrides: []string{`capm3: {os_image_selector: {hardened: null}}`}})
	cs = append(cs, Case{Name: "false selector in a later values file", Mode: ModeLevel,
		Cluster:   cluster(`{os_image_selector: {os: opensuse}}`),
		Overrides: []string{`capm3: {os_image_selector: false, image_key: my-image}`}})
	level("null k8s-version pattern", cluster(`{os_image_selector: {os: opensuse, k8s-version: null}}`))
	level("empty k8s-version pattern overrides the cluster's", cluster(`{os_image_selector: {os: opensuse, k8s-version: ""}}`))
	level("false k8s-flavor pattern overrides the provider's", cluster(`{os_image_selector: {os: opensuse, k8s-flavor: false}}`))
	level("image_key alone, not in os_images", cluster(`{image_key: not-there}`))
	level("image_key null", cluster(`{image_key: null}`))
	level("image_key empty", cluster(`{image_key: ""}`))
	level("image_key that is a number", cluster(`{image_key: 123}`))
	level("image_key that is true", cluster(`{image_key: true}`))
	level("image_key that is a number, with a selector", cluster(`{image_key: 123, os_image_selector: {os: opensuse}}`))
	level("empty k8s_version", strings.Replace(cluster(`{os_image_selector: {os: opensuse}}`), "v1.32.5+rke2r1", `""`, 1))
	level("k8s_version v alone", strings.Replace(cluster(`{os_image_selector: {os: opensuse}}`), "v1.32.5+rke2r1", `v`, 1))
	level("empty bootstrap provider", strings.Replace(cluster(`{os_image_selector: {os: opensuse}}`), "cabpr", `""`, 1))
	level("autoselect registries true", cluster(`{os_image_selector: {os: opensuse}}`, `os_image_selector_autoselect_registries: true`))
	level("selector that is a list", cluster(`{os_image_selector: [os]}`))
	level("selector that is a number", cluster(`{os_image_selector: 1, image_key: my-image}`))
	level("selector that is zero", cluster(`{os_image_selector: 0, image_key: my-image}`))
	level("image_key and selector agree", cluster(`{image_key: opensuse-15-6-plain-rke2-1-32, os_image_selector: {os: opensuse}}`))
	level("image_key and selector differ", cluster(`{image_key: my-image, os_image_selector: {os: opensuse}}`))
	level("image_key missing and selector picks", cluster(`{image_key: not-there, os_image_selector: {os: opensuse}}`))
	level("image_key with an ambiguous selector", cluster(`{image_key: my-image, os_image_selector: {os: ubuntu}}`))

	// Issue 13, section 1: no data is altered or invented.
	odd := `{a: {os: ubuntu, os-release: 15.10, k8s-flavor: rke2}, b: {os: ubuntu, os-release: "15.1", k8s-flavor: kubeadm}, n: {os: suse, os-release: null}}`
	pick("number field, matched by its text", odd, `{os-release: "15\\.10"}`)
	pick("number field, matched by its decimal form", odd, `{os-release: "15\\.1"}`)
	pick("number field, not read: ruled out by an earlier key", odd, `{k8s-flavor: kubeadm, os-release: ".*"}`)
	pick("number field read after earlier keys match", odd, `{k8s-flavor: rke2, os-release: ".*"}`)
	pick("null field read by the empty pattern", odd, `{os: suse, os-release: ""}`)
	pick("null field, ruled out earlier", odd, `{k8s-flavor: rke2, os: ubuntu, os-release: "15\\.10|15\\.1"}`)
	pick("null image entry", `{a: {os: ubuntu}, gone: ~}`, `{os: "//unset"}`)
	pick("null image entry, any selector", `{a: {os: ubuntu}, gone: ~}`, `{os: ubuntu}`)
	pick("image entry that is not a map", `{a: {os: ubuntu}, s: just-a-string}`, `{os: ubuntu}`)
	pick("map field not read", `{a: {os: ubuntu, extra: {a: b}}, b: {os: suse}}`, `{os: suse}`)
	pick("map field not read, same image", `{a: {os: ubuntu, extra: {a: b}}, b: {os: suse}}`, `{os: ubuntu}`)
	pick("map field read", `{a: {os: ubuntu, extra: {a: b}}, b: {os: suse}}`, `{os: ubuntu, extra: ".*", _use_extra_keys_: true}`)
	pick("list field read", `{a: {os: ubuntu, tags: [x]}, b: {os: suse}}`, `{os: ubuntu, tags: ".*", _use_extra_keys_: true}`)
	pick("boolean field matches true", `{a: {os: ubuntu, hardened: true}, b: {os: ubuntu, hardened: false}}`, `{hardened: "true"}`)
	pick("boolean field matches a boolean", `{a: {os: ubuntu, hardened: true}, b: {os: ubuntu, hardened: false}}`, `{hardened: false}`)
	pick("boolean field matches a pattern", `{a: {os: ubuntu, hardened: true}, b: {os: ubuntu, hardened: false}}`, `{hardened: "t.*"}`)
	pick("integer field", `{a: {os: ubuntu, os-release: 24}, b: {os: suse}}`, `{os-release: "24"}`)
	pick("empty catalog", `{}`, `{os: ubuntu}`)
	pick("numeric key field read as _os_images_key_", `{"123": {os: ubuntu}, b: {os: suse}}`, `{_os_images_key_: "12.*"}`)
	pick("own _os_images_key_ field is overridden", `{a: {_os_images_key_: b, os: ubuntu}, b: {os: suse}}`, `{_os_images_key_: b}`)
	level("number field in a cluster's own catalog", strings.Join([]string{
		"k8s_version: v1.32.5+rke2r1", "capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}",
		"os_images: {a: {os: ubuntu, os-release: 15.10, k8s-flavor: rke2, k8s-version: 1.32.5+rke2r1}}",
		"capm3: {os_image_selector: {os-release: \"15\\\\.10\"}}",
	}, "\n"))

	// Documented differences, kept on purpose.
	pick("pattern escaping its anchors", handCatalog, `{os: "ubuntu)|(opensuse"}`)
	pick("invalid regular expression", handCatalog, `{os: "ubuntu("}`)
	pick("invalid regular expression not reached", handCatalog, `{k8s-flavor: none, os: "ubuntu("}`)
	pick("extra key with _use_extra_keys_ false", handCatalog, `{commit-id: ".*", _use_extra_keys_: false, os: opensuse}`)
	pick("_use_extra_keys_ not a boolean", handCatalog, `{_use_extra_keys_: "yes", os: opensuse}`)
	pick("_use_extra_keys_ quoted", handCatalog, `{_use_extra_keys_: "true", uri: "https://.*"}`)
	level("unknown bootstrap provider with k8s-flavor set", strings.Replace(cluster(`{os_image_selector: {os: opensuse, k8s-flavor: rke2}}`), "cabpr", "cabpx", 1))
	level("no k8s_version with k8s-version set", strings.Replace(cluster(`{os_image_selector: {os: opensuse, k8s-version: ".*"}}`), "k8s_version: v1.32.5+rke2r1", "", 1))
	level("unknown bootstrap provider", strings.Replace(cluster(`{os_image_selector: {os: opensuse}}`), "cabpr", "cabpx", 1))
	level("no k8s_version", strings.Replace(cluster(`{os_image_selector: {os: opensuse}}`), "k8s_version: v1.32.5+rke2r1", "", 1))
	level("numeric k8s_version", strings.Replace(cluster(`{os_image_selector: {os: opensuse}}`), "v1.32.5+rke2r1", "1.32", 1))
	level("autoselect registries", cluster(`{os_image_selector: {os: ubuntu, hardened: "false", k8s-flavor: rke2}}`, `os_image_selector_autoselect_registries: "sylva"`))
	level("autoselect registries, none", cluster(`{os_image_selector: {os: ubuntu, hardened: "false", k8s-flavor: rke2}}`, `os_image_selector_autoselect_registries: "other"`))
	level("autoselect registries empty", cluster(`{os_image_selector: {os: ubuntu, hardened: "false", k8s-flavor: rke2}}`, `os_image_selector_autoselect_registries: ""`))
	level("autoselect registries number", cluster(`{os_image_selector: {os: ubuntu}}`, `os_image_selector_autoselect_registries: 5`))

	// internal/selector TestMatches, one image.
	img := `{k: {os: ubuntu, os-release: noble, hardened: "false", k8s-version: 1.32.5+rke2r1, flavor: "", size: "22000000000"}}`
	for i, sel := range []string{
		`{}`, `{os: ubuntu}`, `{os: ubu}`, `{os: ubuntu2}`, `{os: ub.*}`, `{os: opensuse|ubuntu}`, `{os: ubun|tu}`,
		`{os: Ubuntu}`, `{os: "(?i)UBUNTU"}`, `{os: ubuntu, os-release: jammy}`, `{os: ubuntu, os-release: noble|jammy}`,
		`{hardened: false}`, `{hardened: true}`, `{commit-tag: "//unset"}`, `{commit-tag: ".*"}`, `{commit-tag: ""}`,
		`{flavor: ""}`, `{flavor: "//unset"}`, `{commit-tag: 0.7.6}`, `{k8s-version: "1.32.5\\+rke2r1"}`,
		`{k8s-version: "1.32.5+rke2r1"}`, `{_os_images_key_: k}`, `{_os_images_key_: "k.*"}`, `{_os_images_key_: kk}`,
		`{_use_extra_keys_: true, size: "22[0-9]+"}`, `{_use_extra_keys_: true, md5: "//unset"}`,
		`{os: "^ubuntu$"}`, `{os: "^(ubuntu)$"}`, `{size: "1"}`, `{os-release: 15.6}`, `{os: {}}`, `{os: [a]}`,
	} {
		pick(fmt.Sprintf("selector TestMatches %d", i), img, sel)
	}
	// internal/selector TestPick and TestList.
	three := `{ubuntu-noble-plain: {os: ubuntu, hardened: "false"}, ubuntu-noble-hardened: {os: ubuntu, hardened: "true"}, opensuse-plain: {os: opensuse, hardened: "false"}}`
	for i, sel := range []string{`{os: ubuntu, hardened: true}`, `{os: debian}`, `{os: ubuntu}`, `{}`, `{_os_images_key_: opensuse-plain}`} {
		pick(fmt.Sprintf("selector TestPick %d", i), three, sel)
	}
	list("selector TestList", `{a: {os: ubuntu}, b: {os: opensuse}, c: {os: leapmicro}}`, `{os: ubuntu}`, `{_os_images_key_: b}`)
	list("empty list", three)
	list("list with a bad selector second", three, `{os: ubuntu}`, `{os: 5}`)
	list("list with a null image", `{a: {os: ubuntu}, z: null}`, `{os: ubuntu}`)
	// internal/selector TestResolve, as levels.
	resolveCat := strings.ReplaceAll(three, "\n", " ")
	for i, capm3 := range []string{
		`{image_key: opensuse-plain}`, `{image_key: debian}`, `{os_image_selector: {os: opensuse}}`,
		`{image_key: opensuse-plain, os_image_selector: {os: opensuse}}`, `{image_key: ubuntu-noble-plain, os_image_selector: {os: opensuse}}`,
		`{image_key: ubuntu-noble-plain, os_image_selector: {os: ubuntu}}`, `{image_key: debian, os_image_selector: {os: opensuse}}`,
		`{}`, `{image_key: "opensuse-.*"}`,
	} {
		level(fmt.Sprintf("selector TestResolve %d", i), strings.Join([]string{
			"k8s_version: v1.32.5+rke2r1", "capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}",
			"os_images: " + resolveCat, "capm3: " + capm3,
			// The finalized keys would rule every image out: match them.
			"os_image_selector_autoselect_registries: \"//unset\"",
		}, "\n"))
	}
	// internal/selector TestFinalize, as levels over images of every flavor.
	finalCat := `{r: {k8s-flavor: rke2, k8s-version: 1.32.5+rke2r1, os: ubuntu}, k: {k8s-flavor: kubeadm, k8s-version: 1.31.4, os: ubuntu}, c: {k8s-flavor: ck8s, k8s-version: 1.31.4, os: ubuntu}, o: {k8s-flavor: openshift, k8s-version: "4.17", os: ubuntu}, m: {k8s-flavor: kubeadm, k8s-version: 1.31.4, os: ubuntu, oci-image-registry-key: mine}}`
	for i, c := range []struct{ version, provider, sel, extra string }{
		{"v1.32.5+rke2r1", "cabpr", `{os: ubuntu}`, ""},
		{"v1.32.5+rke2r1", "cabpr", `{k8s-version: "1.31.*", k8s-flavor: kubeadm, oci-image-registry-key: mine}`, ""},
		{"v1.31.4", "cabpk", `{}`, ""},
		{"1.31.4", "cabpck", `{}`, ""},
		{"v4.17", "cabpoa", `{}`, ""},
		{"v1.31.4", "cabpk", `{}`, `os_image_selector_autoselect_registries: "sylva|mine"`},
		{"v1.31.4", "cabpx", `{os: ubuntu}`, ""},
		{"v1.31.4", "", `{os: ubuntu}`, ""},
		{"v1.31(", "cabpk", `{os: ubuntu}`, ""},
		{"v1.31.4", "cabpk", `{os: ubuntu}`, `os_image_selector_autoselect_registries: "[a"`},
		{"v1.31.4", "cabpk", `{os: ubuntu, k8s-version: "1\\.31\\.4"}`, ""},
	} {
		level(fmt.Sprintf("selector TestFinalize %d", i), strings.Join([]string{
			"k8s_version: " + c.version, "capi_providers: {infra_provider: capm3, bootstrap_provider: " + c.provider + "}",
			"os_images: " + finalCat, "capm3: {os_image_selector: " + c.sel + "}", c.extra,
		}, "\n"))
	}
	// internal/capm3's base values: root <- default <- machine deployment.
	capm3Cat := `{ubuntu-plain-rke2-1-32: {os: ubuntu, hardened: "false", k8s-version: 1.32.5+rke2r1, k8s-flavor: rke2, oci-image-registry-key: sylva}, ubuntu-hardened-rke2-1-32: {os: ubuntu, hardened: "true", k8s-version: 1.32.5+rke2r1, k8s-flavor: rke2, oci-image-registry-key: sylva}, opensuse-plain-rke2-1-32: {os: opensuse, hardened: "false", k8s-version: 1.32.5+rke2r1, k8s-flavor: rke2, oci-image-registry-key: sylva}, ubuntu-plain-rke2-1-31: {os: ubuntu, hardened: "false", k8s-version: 1.31.9+rke2r1, k8s-flavor: rke2, oci-image-registry-key: sylva}, ubuntu-plain-kubeadm-1-32: {os: ubuntu, hardened: "false", k8s-version: 1.32.5, k8s-flavor: kubeadm, oci-image-registry-key: sylva}}`
	level("capm3 base values", strings.Join([]string{
		"name: c1", "k8s_version: v1.32.5+rke2r1", "capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}",
		"os_images: " + capm3Cat,
		`capm3: {os_image_selector: {os: ubuntu, hardened: "false"}, image_provisioning_host: 192.0.2.10}`,
		"control_plane: {capm3: {}}", "machine_deployment_default: {capm3: {automatedCleaningMode: disabled}}",
		`machine_deployments: {md0: {capm3: {os_image_selector: {hardened: "true"}}}, md1: {capm3: {os_image_selector: {os: opensuse}}}, md2: {capm3: {os_image_selector: {os: debian}}}, md3: {capm3: {os_image_selector: {hardened: ".*"}}}}`,
	}, "\n"), "", "md0", "md1", "md2", "md3")

	// The library's own test data (test-data.values.yaml).
	libCat := `{ubuntu-jammy-plain-kubeadm-1-26-9: {os: ubuntu, k8s-version: 1.26.9, k8s-flavor: kubeadm}, ubuntu-jammy-plain-kubeadm-1-30-8: {os: ubuntu, k8s-version: 1.30.8, k8s-flavor: kubeadm, hardened: false}, ubuntu-jammy-plain-rke2-1-30-8: {os: ubuntu, k8s-version: 1.30.8, k8s-flavor: rke2}, ubuntu-jammy-hardened-kubeadm-1-30-8: {os: ubuntu, k8s-version: 1.30.8, k8s-flavor: kubeadm, hardened: true}, ubuntu-noble-plain-ck8s-1-32-1: {os: ubuntu, k8s-version: 1.32.1, k8s-flavor: ck8s}}`
	for i, c := range []struct{ def, version, provider string }{
		{`{os_image_selector: {os: ubuntu, hardened: true}}`, "1.30.8", "cabpk"},
		{`{os_image_selector: {os: ubuntu}}`, "1.26.9", "cabpk"},
		{`{image_key: xxxx-foo-bar}`, "1.30.8", "cabpk"},
		{`{os_image_selector: {os: ubuntu, hardened: true}, image_key: ubuntu-jammy-hardened-kubeadm-1-30-8}`, "1.30.8", "cabpk"},
		{`{os_image_selector: {os: ubuntu}}`, "1.32.1", "cabpck"},
	} {
		level(fmt.Sprintf("library compute-image-key %d", i), strings.Join([]string{
			"k8s_version: " + c.version, "capi_providers: {infra_provider: capm3, bootstrap_provider: " + c.provider + "}",
			"os_images: " + libCat, "capm3: " + c.def,
		}, "\n"))
	}
	abc := `{image-a: {os: "42", k8s-flavor: "99"}, image-b: {k8s-flavor: "95"}, image-c: {k8s-flavor: "95", k8s-version: dummy}}`
	for i, sel := range []string{`{os: "42", k8s-flavor: "99"}`, `{k8s-flavor: "95", k8s-version: dummy}`, `{k8s-flavor: "95"}`, `{hardened: "43"}`, `{k8s-version: dummy}`} {
		pick(fmt.Sprintf("library pick-os-image %d", i), abc, sel)
		list(fmt.Sprintf("library select-os-images %d", i), abc, sel)
	}
	return cs
}

// The pools the random cases draw from: values seen in real catalogs and
// selectors, plus the odd ones the rules must get right.
var (
	poolOS         = []string{"ubuntu", "opensuse", "leapmicro"}
	poolRelease    = []string{"noble", "jammy", "15.6", "6.0"}
	poolK8sFlavor  = []string{"rke2", "kubeadm", "ck8s"}
	poolK8sVersion = []string{"1.32.5+rke2r1", "1.31.4+rke2r1", "1.32.5", "1.31.4", "1.30.8"}
	poolRegistry   = []string{"sylva", "local"}
	poolCommitTag  = []string{"0.7.6", "0.7.7"}
	poolPatterns   = map[string][]any{
		"os":                     {"ubuntu", "opensuse", "ubuntu|opensuse", "(ubuntu|leapmicro)", "ubu.*", "^ubuntu$", "^opensuse", "leapmicro$", ".*", "//unset", "", "(?i)UBUNTU", "Ubuntu", "ubuntu)|(opensuse", "ubuntu("},
		"os-release":             {"noble", "jammy|noble", "15\\.6", "15.6", "6\\.0", "15\\..*", "//unset", ".*", "(noble|//unset)"},
		"k8s-flavor":             {"rke2", "kubeadm", "ck8s", "rke2|kubeadm", ".*", "//unset"},
		"k8s-version":            {"1.32.5\\+rke2r1", "1.32.5+rke2r1", "1\\.32\\..*", "1.31.4", "1\\.3[12]\\.[0-9]+", "^1\\.32\\.5$", ".*\\+rke2r1", "1.32.5.*", "//unset"},
		"hardened":               {true, false, "true", "false", "t.*", "true|false", "//unset", "(false|//unset)"},
		"flavor":                 {"plain", "hardened", "plain|hardened", "//unset", ".*"},
		"oci-image-registry-key": {"sylva", "local", "sylva|local", ".*", "//unset", "(sylva|//unset)"},
		"commit-tag":             {"0.7.6", "0\\.7\\.[67]", "//unset", ".*"},
		"_os_images_key_":        {"img-0", "img-[01]", "img-.*", "img-1|img-2", ".*"},
	}
	poolK8sVersions = []any{"v1.32.5+rke2r1", "1.32.5+rke2r1", "v1.31.4+rke2r1", "v1.32.5", "v1.31.4", "1.30.8", "v1.32.5+rke2r1", "v1.32.5", ""}
	poolProviders   = []string{"cabpr", "cabpk", "cabpck", "cabpr", "cabpk"}
	poolAutoselect  = []any{nil, "sylva", "local|sylva", ".*", "", "(sylva|//unset)", false, nil, nil}
)

func pickOne[T any](r *rand.Rand, pool []T) T { return pool[r.IntN(len(pool))] }

// randomCatalog builds an os_images map of a few images. Now and then it
// holds what a hand-written catalog may: a boolean, a number, a null field,
// a map field, or a null image entry.
func randomCatalog(r *rand.Rand) map[string]any {
	n := 2 + r.IntN(6)
	cat := map[string]any{}
	for i := range n {
		img := map[string]any{}
		maybe := func(field string, v any) {
			if r.IntN(8) > 0 {
				img[field] = v
			}
		}
		maybe("os", pickOne(r, poolOS))
		maybe("os-release", pickOne(r, poolRelease))
		img["k8s-flavor"] = pickOne(r, poolK8sFlavor)
		img["k8s-version"] = pickOne(r, poolK8sVersion)
		switch r.IntN(4) {
		case 0:
			img["hardened"] = r.IntN(2) == 0
		case 1, 2:
			img["hardened"] = pickOne(r, []string{"true", "false"})
		}
		maybe("flavor", pickOne(r, []string{"plain", "hardened"}))
		if r.IntN(4) > 0 {
			img["oci-image-registry-key"] = pickOne(r, poolRegistry)
		}
		maybe("commit-tag", pickOne(r, poolCommitTag))
		img["sha256"] = strings.Repeat(fmt.Sprintf("%x", i%16), 64)
		switch r.IntN(25) {
		case 0:
			img["os-release"] = 15.6 // an unquoted number
		case 1:
			img["os"] = nil
		case 2:
			img["extra"] = map[string]any{"a": "b"}
		case 3:
			img["commit-tag"] = 7
		case 4:
			img["k8s-version"] = 1.32
		case 5:
			img["oci-image-registry-key"] = nil
		case 6:
			img["k8s-flavor"] = []any{"rke2"}
		}
		cat[fmt.Sprintf("img-%d", i)] = img
	}
	if r.IntN(40) == 0 {
		cat["img-gone"] = nil
	}
	return cat
}

// randomSelector builds a selector of a few keys. Now and then it holds
// an extra key, with or without _use_extra_keys_, or a null pattern.
func randomSelector(r *rand.Rand, maxKeys int) map[string]any {
	keys := slices.Sorted(maps.Keys(poolPatterns))
	sel := map[string]any{}
	for range r.IntN(maxKeys + 1) {
		k := pickOne(r, keys)
		sel[k] = pickOne(r, poolPatterns[k])
	}
	switch r.IntN(30) {
	case 0:
		sel["commit-id"] = ".*"
	case 1:
		sel["commit-id"] = "//unset"
		sel["_use_extra_keys_"] = true
	case 2:
		sel["extra"] = ".*"
		sel["_use_extra_keys_"] = true
	case 3:
		sel[pickOne(r, keys)] = nil
	}
	return sel
}

// randomLevelDef is what a level of capm3 values says about its image.
func randomLevelDef(r *rand.Rand, keys []string) map[string]any {
	def := map[string]any{}
	switch r.IntN(9) {
	case 0, 1, 2:
		def["os_image_selector"] = randomSelector(r, 2)
	case 3:
		def["os_image_selector"] = map[string]any{}
	case 4:
		def["os_image_selector"] = pickOne(r, []any{false, nil})
	case 5:
		if r.IntN(4) == 0 {
			def["os_image_selector"] = pickOne(r, []any{"", 0, "os=ubuntu", []any{}})
		}
	}
	switch r.IntN(7) {
	case 0:
		def["image_key"] = pickOne(r, keys)
	case 1:
		def["image_key"] = pickOne(r, []any{"", nil, "not-there", false, 7})
	}
	return def
}

// randomCluster builds cluster values with levels to merge: root,
// control plane, machine deployment default and two machine deployments.
func randomCluster(r *rand.Rand) map[string]any {
	cat := randomCatalog(r)
	keys := slices.Sorted(maps.Keys(cat))
	v := map[string]any{
		"name":        "c1",
		"k8s_version": pickOne(r, poolK8sVersions),
		"capi_providers": map[string]any{
			"infra_provider": "capm3", "bootstrap_provider": pickOne(r, poolProviders),
		},
		"os_images": cat,
		"capm3":     randomLevelDef(r, keys),
	}
	if a := pickOne(r, poolAutoselect); a != nil {
		v["os_image_selector_autoselect_registries"] = a
	}
	if r.IntN(2) == 0 {
		v["control_plane"] = map[string]any{"capm3": randomLevelDef(r, keys)}
	}
	if r.IntN(2) == 0 {
		v["machine_deployment_default"] = map[string]any{"capm3": randomLevelDef(r, keys)}
	}
	v["machine_deployments"] = map[string]any{
		"md0": map[string]any{"capm3": randomLevelDef(r, keys)},
		"md1": map[string]any{"capm3": randomLevelDef(r, keys)},
	}
	return v
}

// randomCases draws n seeded inputs of each mode.
func randomCases(seed uint64, n int) []Case {
	r := rand.New(rand.NewPCG(seed, 13))
	var cs []Case
	for i := range n {
		cat := toYAML(randomCatalog(r))
		cs = append(cs, Case{Name: fmt.Sprintf("random pick %d", i), Mode: ModePick, OSImages: cat,
			Selectors: []string{toYAML(randomSelector(r, 4))}})
		var sels []string
		for range r.IntN(3) + 1 {
			sels = append(sels, toYAML(randomSelector(r, 3)))
		}
		cs = append(cs, Case{Name: fmt.Sprintf("random list %d", i), Mode: ModeList, OSImages: cat, Selectors: sels})
		cluster := toYAML(randomCluster(r))
		var overrides []string
		if r.IntN(4) == 0 {
			// A later values file that redefines one level.
			level := pickOne(r, []string{"capm3", "control_plane", "machine_deployments"})
			def := randomLevelDef(r, []string{"img-0", "img-1"})
			var doc map[string]any
			switch level {
			case "capm3":
				doc = map[string]any{"capm3": def}
			case "control_plane":
				doc = map[string]any{"control_plane": map[string]any{"capm3": def}}
			default:
				doc = map[string]any{"machine_deployments": map[string]any{"md0": map[string]any{"capm3": def}}}
			}
			overrides = append(overrides, toYAML(doc))
		}
		for _, md := range []string{"", "md0", "md1"} {
			cs = append(cs, Case{Name: fmt.Sprintf("random level %d", i), Mode: ModeLevel, Cluster: cluster, Overrides: overrides, MD: md})
		}
	}
	return cs
}
