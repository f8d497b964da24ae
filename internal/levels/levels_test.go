package levels

import (
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

func parse(t *testing.T, doc string) values.Values {
	t.Helper()
	v, err := values.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("parsing the test's values: %v", err)
	}
	return v
}

// errContains fails unless err is an error whose text holds every part.
func errContains(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one with %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not say %q", err, p)
		}
	}
}

func TestSplitMergesMostGeneralFirst(t *testing.T) {
	v := parse(t, `
capm3: {os_image_selector: {os: ubuntu}, image_key: root-key, keep: root}
control_plane:
  capm3: {image_key: cp-key}
machine_deployment_default:
  capm3: {image_key: md-default-key, from_default: md}
machine_deployments:
  zeta: {capm3: {image_key: zeta-key}}
  alpha: {}
  removed: null
`)
	lvs, errs := Split(v)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var paths []string
	for _, lv := range lvs {
		paths = append(paths, lv.Path)
	}
	if got := strings.Join(paths, " "); got != ".control_plane.capm3 .machine_deployments.alpha.capm3 .machine_deployments.zeta.capm3" {
		t.Fatalf("levels %s: want the control plane, then the machine deployments in name order, without the removed one", got)
	}
	cp, alpha, zeta := lvs[0], lvs[1], lvs[2]
	if cp.MachineDeployment != "" || alpha.MachineDeployment != "alpha" || zeta.MachineDeployment != "zeta" {
		t.Errorf("machine deployment names %q %q %q", cp.MachineDeployment, alpha.MachineDeployment, zeta.MachineDeployment)
	}
	for _, c := range []struct {
		lv       Level
		key, val string
	}{
		{cp, "image_key", "cp-key"},
		{cp, "keep", "root"},
		{alpha, "image_key", "md-default-key"}, // the default, over the root
		{alpha, "from_default", "md"},
		{zeta, "image_key", "zeta-key"}, // its own, over the default
		{zeta, "keep", "root"},
	} {
		if got := c.lv.Values[c.key]; got != c.val {
			t.Errorf("%s %s = %v, want %s", c.lv.Path, c.key, got, c.val)
		}
	}
	if _, ok := cp.Values["from_default"]; ok {
		t.Error("machine_deployment_default reached the control plane")
	}
	if sel, _ := zeta.Values["os_image_selector"].(map[string]any); sel["os"] != "ubuntu" {
		t.Errorf("the root selector did not reach a machine deployment: %v", zeta.Values)
	}
}

// A null at a more specific level is kept, as sylva-library's
// mergeOverwrite keeps it, rather than letting the general value through.
func TestSplitKeepsANullOfAMoreSpecificLevel(t *testing.T) {
	v := parse(t, `
capm3: {os_image_selector: {os: ubuntu}}
control_plane: {capm3: {os_image_selector: null}}
`)
	lvs, errs := Split(v)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	sel, ok := lvs[0].Values["os_image_selector"]
	if !ok || sel != nil {
		t.Fatalf("os_image_selector = %v (present %v), want a null", sel, ok)
	}
}

// Every map of the wrong type is reported, by its path, not only the first.
func TestSplitNamesEveryMisshapenLevel(t *testing.T) {
	v := parse(t, `
capm3: [not, a, map]
control_plane: {capm3: "a string"}
machine_deployments:
  md1: {capm3: 3}
`)
	lvs, errs := Split(v)
	if lvs != nil {
		t.Errorf("levels %v beside errors", lvs)
	}
	var all []string
	for _, e := range errs {
		all = append(all, e.Error())
	}
	joined := strings.Join(all, "\n")
	for _, path := range []string{".capm3", ".control_plane.capm3", ".machine_deployments.md1.capm3"} {
		if !strings.Contains(joined, path+":") {
			t.Errorf("no error names %s:\n%s", path, joined)
		}
	}
}

func TestFinalization(t *testing.T) {
	for _, c := range []struct {
		name string
		doc  string
		want selector.Cluster
		err  []string
	}{
		{
			name: "all set",
			doc:  "k8s_version: v1.32.5+rke2r1\ncapi_providers: {bootstrap_provider: cabpr}\nos_image_selector_autoselect_registries: 'reg-.*'",
			want: selector.Cluster{K8sVersion: "v1.32.5+rke2r1", K8sVersionSet: true, BootstrapProvider: "cabpr", AutoselectRegistries: "reg-.*"},
		},
		{name: "nothing set", doc: "{}", want: selector.Cluster{}},
		{name: "an empty k8s_version is set", doc: `k8s_version: ""`, want: selector.Cluster{K8sVersionSet: true}},
		{name: "autoselect true is the pattern true", doc: "os_image_selector_autoselect_registries: true", want: selector.Cluster{AutoselectRegistries: "true"}},
		{name: "autoselect false is the default", doc: "os_image_selector_autoselect_registries: false", want: selector.Cluster{}},
		{name: "autoselect empty is the default", doc: `os_image_selector_autoselect_registries: ""`, want: selector.Cluster{}},
		{
			name: "a k8s_version as a number is refused, not re-formatted",
			doc:  "k8s_version: 1.30",
			err:  []string{".k8s_version: must be a string (quote it)"},
		},
		{
			name: "a bootstrap provider as a number",
			doc:  "capi_providers: {bootstrap_provider: 7}",
			err:  []string{".capi_providers.bootstrap_provider: must be a string"},
		},
		{name: "capi_providers not a map", doc: "capi_providers: cabpr", err: []string{".capi_providers"}},
		{
			name: "autoselect as a number",
			doc:  "os_image_selector_autoselect_registries: 5",
			err:  []string{".os_image_selector_autoselect_registries: must be a string"},
		},
		{
			name: "every fault at once",
			doc:  "k8s_version: 1.30\ncapi_providers: {bootstrap_provider: 7}",
			err:  []string{".k8s_version", ".capi_providers.bootstrap_provider"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Finalization(parse(t, c.doc))
			if c.err != nil {
				errContains(t, err, c.err...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestIsSet(t *testing.T) {
	for _, c := range []struct {
		v    any
		want bool
	}{
		{nil, false}, {false, false}, {"", false}, {float64(0), false}, {0, false}, {int64(0), false},
		{map[string]any{}, false}, {[]any{}, false},
		{true, true}, {"x", true}, {float64(0.5), true}, {1, true}, {int64(-1), true},
		{map[string]any{"os": "ubuntu"}, true}, {[]any{nil}, true},
		{struct{}{}, true}, // any other value is set, as a template's if has it
	} {
		if got := IsSet(c.v); got != c.want {
			t.Errorf("IsSet(%#v) = %v, want %v", c.v, got, c.want)
		}
	}
}

// cluster is the finalization of the tests' clusters.
var cluster = selector.Cluster{K8sVersion: "v1.32.5+rke2r1", BootstrapProvider: "cabpr"}

func TestChoice(t *testing.T) {
	for _, c := range []struct {
		name     string
		level    string
		finalize error
		key      string
		selector string // the finalized selector, "" for none
		set      bool
		err      []string
	}{
		{name: "nothing", level: "{}", set: false},
		{name: "an image_key", level: "image_key: ubuntu-rke2", key: "ubuntu-rke2", set: true},
		{
			name: "a selector, finalized for the cluster", level: "os_image_selector: {os: ubuntu}",
			selector: `{k8s-flavor: rke2, k8s-version: 1.32.5\+rke2r1, oci-image-registry-key: .*, os: ubuntu}`, set: true,
		},
		{
			name: "a key the user set is kept", level: "os_image_selector: {os: ubuntu, k8s-flavor: kubeadm}",
			selector: `{k8s-flavor: kubeadm, k8s-version: 1.32.5\+rke2r1, oci-image-registry-key: .*, os: ubuntu}`, set: true,
		},
		{
			name: "both", level: "{image_key: k, os_image_selector: {os: ubuntu}}", key: "k",
			selector: `{k8s-flavor: rke2, k8s-version: 1.32.5\+rke2r1, oci-image-registry-key: .*, os: ubuntu}`, set: true,
		},
		{name: "an empty selector is no selector", level: "os_image_selector: {}", set: false},
		{name: "a false selector is no selector", level: "os_image_selector: false", set: false},
		{name: "an image_key false beside a selector is ignored", level: "{image_key: false, os_image_selector: {os: ubuntu}}",
			selector: `{k8s-flavor: rke2, k8s-version: 1.32.5\+rke2r1, oci-image-registry-key: .*, os: ubuntu}`, set: true},
		{name: "an image_key false alone is refused", level: "image_key: false", err: []string{".control_plane.capm3.image_key: must be the key of an image in os_images, got the boolean false"}},
		{name: "an image_key as a number is refused", level: "image_key: 12", err: []string{".control_plane.capm3.image_key", "12"}},
		{name: "a set image_key of the wrong type beside a selector", level: "{image_key: 12, os_image_selector: {os: ubuntu}}", err: []string{".image_key"}},
		{name: "a selector of the wrong shape", level: "os_image_selector: ubuntu", err: []string{".control_plane.capm3.os_image_selector: an OS image selector must be a map"}},
		{name: "a selector with an unknown key", level: "os_image_selector: {colour: blue}", err: []string{".control_plane.capm3.os_image_selector", "colour"}},
		{
			name: "a selector the cluster's values cannot complete", level: "os_image_selector: {os: ubuntu}",
			finalize: errFinalize, err: []string{".control_plane.capm3.os_image_selector: cannot be completed for the cluster", errFinalize.Error()},
		},
		{
			name: "an image_key alone needs no finalization", level: "image_key: k",
			finalize: errFinalize, key: "k", set: true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			lv := Level{Path: ".control_plane.capm3", Values: parse(t, c.level)}
			got, err := lv.Choice(cluster, c.finalize)
			if c.err != nil {
				errContains(t, err, c.err...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.ImageKey != c.key || got.IsSet() != c.set {
				t.Errorf("image_key %q, set %v; want %q, %v", got.ImageKey, got.IsSet(), c.key, c.set)
			}
			sel := ""
			if got.Selector != nil {
				sel = got.Selector.String()
			}
			if sel != c.selector {
				t.Errorf("selector %s, want %s", sel, c.selector)
			}
		})
	}
}

var errFinalize = &finalizeError{}

type finalizeError struct{}

func (*finalizeError) Error() string { return ".k8s_version: must be a string (quote it), got 1.3" }

// A bootstrap provider without a known flavor is only a fault when the
// flavor must be added.
func TestChoiceNeedsAFlavorOnlyWhenItAddsOne(t *testing.T) {
	c := selector.Cluster{K8sVersion: "v1.32.5", BootstrapProvider: "cabpx"}
	_, err := Level{Path: ".capm3", Values: parse(t, "os_image_selector: {os: ubuntu}")}.Choice(c, nil)
	errContains(t, err, ".capm3.os_image_selector", `"cabpx"`)
	if _, err := (Level{Path: ".capm3", Values: parse(t, "os_image_selector: {os: ubuntu, k8s-flavor: mine}")}).Choice(c, nil); err != nil {
		t.Errorf("a selector with its own flavor: %v", err)
	}
}

const levelsValues = `
k8s_version: v1.32.5+rke2r1
capi_providers: {bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu}}
machine_deployments:
  by-key: {capm3: {image_key: rocky, os_image_selector: false, image_delivery: oci}}
  by-hand: {capm3: {os_image_selector: false, image: http://example.com/x.img}}
`

func TestChoices(t *testing.T) {
	got, err := Choices(parse(t, levelsValues))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d choices, want the control plane's and by-key's (by-hand gives its image by hand): %v", len(got), got)
	}
	if cp := got[".control_plane.capm3"]; cp.Selector == nil || cp.ImageKey != "" {
		t.Errorf("control plane: %+v", cp)
	}
	if md := got[".machine_deployments.by-key.capm3"]; md.Selector != nil || md.ImageKey != "rocky" {
		t.Errorf("by-key: %+v", md)
	}
}

// The faults of one level do not hide the choices of the others.
func TestChoicesReportsEachFaultyLevel(t *testing.T) {
	got, err := Choices(parse(t, `
k8s_version: v1.32.5+rke2r1
capi_providers: {bootstrap_provider: cabpr}
capm3: {image_key: good}
machine_deployments:
  bad1: {capm3: {image_key: 1}}
  bad2: {capm3: {os_image_selector: [os]}}
`))
	errContains(t, err, ".machine_deployments.bad1.capm3.image_key", ".machine_deployments.bad2.capm3.os_image_selector")
	if c, ok := got[".control_plane.capm3"]; !ok || c.ImageKey != "good" {
		t.Errorf("the control plane's choice is lost: %v", got)
	}
}

func TestChoiceAt(t *testing.T) {
	v := parse(t, levelsValues)
	c, err := ChoiceAt(v, ".machine_deployments.by-key.capm3")
	if err != nil || c.ImageKey != "rocky" {
		t.Fatalf("by-key: %+v, %v", c, err)
	}
	c, err = ChoiceAt(v, ".machine_deployments.by-hand.capm3")
	if err != nil || c.IsSet() {
		t.Fatalf("by-hand: %+v, %v; want a choice that is not set", c, err)
	}
	_, err = ChoiceAt(v, ".machine_deployments.nope.capm3")
	errContains(t, err, `level ".machine_deployments.nope.capm3": no such level`,
		".control_plane.capm3, .machine_deployments.by-hand.capm3, .machine_deployments.by-key.capm3")
	// Values that cannot be split say why, not that the level is unknown.
	_, err = ChoiceAt(parse(t, "machine_deployments: {md: {capm3: 1}}"), ".machine_deployments.md.capm3")
	errContains(t, err, ".machine_deployments.md.capm3: ")
	if strings.Contains(err.Error(), "no such level") {
		t.Errorf("a misshapen level reported as unknown: %v", err)
	}
}

func sha(c byte) string { return strings.Repeat(string(c), 64) }

func catalog(t *testing.T) osimage.Catalog {
	t.Helper()
	cat, err := osimage.ParseInfo([]byte(`os_images:
  ubuntu-rke2: {os: ubuntu, k8s-version: 1.32.5+rke2r1, k8s-flavor: rke2, oci-image-registry-key: sylva, sha256: "` + sha('a') + `", filename: ubuntu.img}
  ubuntu-kubeadm: {os: ubuntu, k8s-version: 1.32.5, k8s-flavor: kubeadm, oci-image-registry-key: sylva, sha256: "` + sha('b') + `", filename: ubuntu-kubeadm.img}
  rocky: {os: rocky, k8s-version: 1.32.5+rke2r1, k8s-flavor: rke2, sha256: "` + sha('c') + `", filename: rocky.img}
  no-sha: {os: opensuse, k8s-version: 1.32.5+rke2r1, k8s-flavor: rke2, filename: suse.img}
  bad-name: {os: flatcar, k8s-version: 1.32.5+rke2r1, k8s-flavor: rke2, sha256: "` + sha('d') + `", filename: ../etc/passwd}
`))
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

func TestPicks(t *testing.T) {
	picks, err := Picks(parse(t, levelsValues), catalog(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []Pick{
		{Level: ".control_plane.capm3", ImageKey: "ubuntu-rke2", SHA256: osimage.SHA256(sha('a')), Filename: "ubuntu.img", Delivery: DeliveryHTTP},
		// By oci://, the URL names no file.
		{Level: ".machine_deployments.by-key.capm3", ImageKey: "rocky", SHA256: osimage.SHA256(sha('c')), Delivery: DeliveryOCI},
	}
	if len(picks) != len(want) {
		t.Fatalf("picks %+v, want %+v", picks, want)
	}
	for i := range want {
		if picks[i] != want[i] {
			t.Errorf("pick %d: %+v, want %+v", i, picks[i], want[i])
		}
	}
}

func TestPicksRefuseAnUnknownDelivery(t *testing.T) {
	v := parse(t, levelsValues+"control_plane: {capm3: {image_delivery: nfs}}\n")
	picks, err := Picks(v, catalog(t))
	errContains(t, err, ".control_plane.capm3.image_delivery: must be http", `got "nfs"`)
	if len(picks) != 1 || picks[0].Level != ".machine_deployments.by-key.capm3" {
		t.Errorf("the other level must still pick: %+v", picks)
	}
}

// A level that cannot pick, or picks an image render would not serve, is
// a fault of that level; the other levels still pick.
func TestPicksReportsTheLevelsThatCannotPick(t *testing.T) {
	v := parse(t, `
k8s_version: v1.32.5+rke2r1
capi_providers: {bootstrap_provider: cabpr}
control_plane: {capm3: {image_key: rocky}}
machine_deployments:
  none: {capm3: {os_image_selector: {os: debian}}}
  unknown: {capm3: {image_key: windows}}
  nosha: {capm3: {image_key: no-sha}}
  escape: {capm3: {os_image_selector: {os: flatcar}}}
  both: {capm3: {image_key: ubuntu-kubeadm, os_image_selector: {os: rocky}}}
`)
	picks, err := Picks(v, catalog(t))
	errContains(t, err,
		".machine_deployments.none.capm3: no OS image could be found",
		".machine_deployments.unknown.capm3: nothing in os_images for image_key windows",
		".machine_deployments.nosha.capm3: os_images.no-sha has no sha256",
		".machine_deployments.escape.capm3: os_images.bad-name",
		".machine_deployments.both.capm3: both .os_image_selector and .image_key are set",
	)
	if len(picks) != 1 || picks[0].Level != ".control_plane.capm3" || picks[0].ImageKey != "rocky" {
		t.Errorf("picks %+v, want the control plane's alone", picks)
	}
}

// Two images that match a level's selector are no pick: a tie is never
// broken.
func TestPicksRefusesATie(t *testing.T) {
	v := parse(t, `
k8s_version: v1.32.5+rke2r1
capi_providers: {bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu, k8s-flavor: ".*", k8s-version: ".*"}}
`)
	picks, err := Picks(v, catalog(t))
	errContains(t, err, ".control_plane.capm3", "2 were found", "ubuntu-kubeadm, ubuntu-rke2")
	if len(picks) != 0 {
		t.Errorf("picks %+v", picks)
	}
}

// An empty selector at a more specific level merges into the general one
// and leaves it whole, as Helm's merge does: only false or null unset it.
func TestAnEmptySelectorDoesNotUnsetTheGeneralOne(t *testing.T) {
	got, err := Choices(parse(t, `
k8s_version: v1.32.5+rke2r1
capi_providers: {bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu}}
machine_deployments:
  empty: {capm3: {os_image_selector: {}}}
  unset: {capm3: {os_image_selector: null}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c := got[".machine_deployments.empty.capm3"]; c.Selector == nil || !strings.Contains(c.Selector.String(), "os: ubuntu") {
		t.Errorf("empty: %+v, want the general selector", c)
	}
	if c, ok := got[".machine_deployments.unset.capm3"]; ok {
		t.Errorf("unset: %+v, want no choice", c)
	}
}
