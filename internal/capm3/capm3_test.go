package capm3

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func sha(c byte) string { return strings.Repeat(string(c), 64) }

// testCatalog is (A): one image per (os, hardened) for rke2 1.32.5, plus
// an image of another version and one of another k8s flavor, which the
// finalized selectors must leave out.
func testCatalog() osimage.Catalog {
	img := func(s byte, os, hardened, version, flavor string) osimage.Image {
		return osimage.Image{
			"sha256": sha(s), "filename": fmt.Sprintf("%s-%s-%s.raw", os, hardened, version), "image-format": "raw",
			"os": os, "hardened": hardened, "k8s-version": version, "k8s-flavor": flavor,
			"oci-image-registry-key": "sylva",
		}
	}
	return osimage.Catalog{
		"ubuntu-plain-rke2-1-32":      img('a', "ubuntu", "false", "1.32.5+rke2r1", "rke2"),
		"ubuntu-hardened-rke2-1-32":   img('b', "ubuntu", "true", "1.32.5+rke2r1", "rke2"),
		"opensuse-plain-rke2-1-32":    img('c', "opensuse", "false", "1.32.5+rke2r1", "rke2"),
		"ubuntu-plain-rke2-1-31":      img('d', "ubuntu", "false", "1.31.9+rke2r1", "rke2"),
		"ubuntu-plain-kubeadm-1-32":   img('e', "ubuntu", "false", "1.32.5", "kubeadm"),
		"ubuntu-hardened-rke2-1-32-q": img('f', "ubuntu", "true", "1.32.5+rke2r1", "rke2-other"),
	}
}

// servedAll is (B) serving every image of (A) under the management
// cluster's own keys.
func servedAll() osimage.ServedSet {
	b := osimage.ServedSet{}
	for k, img := range testCatalog() {
		b[osimage.SHA256(img.Get("sha256"))] = osimage.ServedImage{Available: true, ImageKey: "mgmt-" + k}
	}
	return b
}

const baseValues = `
name: c1
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {os: ubuntu, hardened: "false"}
  image_provisioning_host: 192.0.2.10
  image_provisioning_scheme: https
control_plane:
  capm3: {}
machine_deployment_default:
  capm3: {automatedCleaningMode: disabled}
machine_deployments:
  md0:
    capm3: {os_image_selector: {hardened: "true"}}
  md1:
    capm3:
      os_image_selector: {os: opensuse}
      hostSelector: {matchLabels: {role: worker}}
`

// vals parses baseValues with the given YAML documents merged over it.
func vals(t testing.TB, overrides ...string) values.Values {
	t.Helper()
	v, err := values.Parse([]byte(baseValues))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range overrides {
		ov, err := values.Parse([]byte(o))
		if err != nil {
			t.Fatalf("override %q: %v", o, err)
		}
		v = overlay(v, ov)
	}
	return v
}

// overlay merges over into base like values.Merge, but keeps nulls, as
// merged values reaching capm3 may hold them: a null in a more specific
// level must remove what a more general level set.
func overlay(base, over values.Values) values.Values {
	out := values.Values{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		bm, bok := out[k].(map[string]any)
		om, ook := v.(map[string]any)
		if bok && ook {
			out[k] = overlay(bm, om)
		} else {
			out[k] = v
		}
	}
	return out
}

func render(t testing.TB, in Input) ([]Template, []byte) {
	t.Helper()
	ts, err := Render(in)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	out, err := MarshalYAML(ts)
	if err != nil {
		t.Fatal(err)
	}
	return ts, out
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s:\n%s", path, got)
	}
}

// The golden files pin the exact output, hashes included, so that a
// change of hashing (across versions, processes or platforms) shows.
func TestRenderGolden(t *testing.T) {
	for _, tc := range []struct {
		file       string
		apiVersion string
		namespace  string
		extra      string
	}{
		{file: "v1beta1.yaml"},
		{file: "v1beta2.yaml", apiVersion: "v1beta2", namespace: "ws1", extra: `
control_plane:
  capm3:
    nodeReuse: true
    dataTemplate: {name: c1-cp-metadata}
`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			_, out := render(t, Input{Values: vals(t, tc.extra), Catalog: testCatalog(), Served: servedAll(), APIVersion: tc.apiVersion, Namespace: tc.namespace})
			golden(t, tc.file, out)
		})
	}
}

func TestRenderPicks(t *testing.T) {
	ts, _ := render(t, Input{Values: vals(t), Catalog: testCatalog(), Served: servedAll()})
	want := []struct{ level, md, key, prefix string }{
		{".control_plane.capm3", "", "ubuntu-plain-rke2-1-32", "c1-cp-"},
		{".machine_deployments.md0.capm3", "md0", "ubuntu-hardened-rke2-1-32", "c1-md0-"},
		{".machine_deployments.md1.capm3", "md1", "opensuse-plain-rke2-1-32", "c1-md1-"},
	}
	if len(ts) != len(want) {
		t.Fatalf("got %d templates, want %d", len(ts), len(want))
	}
	for i, w := range want {
		got := ts[i]
		if got.Level != w.level || got.MachineDeployment != w.md || got.ImageKey != w.key || !strings.HasPrefix(got.Name(), w.prefix) || len(got.Name()) != len(w.prefix)+hashLen {
			t.Errorf("template %d: got %s %q %s %s, want %s %q %s %s...", i, got.Level, got.MachineDeployment, got.ImageKey, got.Name(), w.level, w.md, w.key, w.prefix)
		}
	}
	img := field(t, ts[0].Object, "spec", "template", "spec", "image").(map[string]any)
	wantImg := map[string]any{
		"url":          "https://192.0.2.10/images/" + sha('a') + "/ubuntu-false-1.32.5+rke2r1.raw",
		"checksum":     sha('a'),
		"checksumType": "sha256",
		"format":       "raw",
	}
	if fmt.Sprint(img) != fmt.Sprint(wantImg) {
		t.Errorf("image block\n got %v\nwant %v", img, wantImg)
	}
}

// field walks obj along path.
func field(t testing.TB, obj map[string]any, path ...string) any {
	t.Helper()
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("%v: %s is not under a map", path, p)
		}
		if cur, ok = m[p]; !ok {
			t.Fatalf("%v: no %s", path, p)
		}
	}
	return cur
}

func TestRenderFields(t *testing.T) {
	tests := []struct {
		name       string
		apiVersion string
		extra      string
		check      func(t *testing.T, cp map[string]any)
	}{
		{
			name: "v1beta1 uses format", check: func(t *testing.T, cp map[string]any) {
				if field(t, cp, "apiVersion") != V1Beta1 || field(t, cp, "spec", "template", "spec", "image", "format") != "raw" {
					t.Errorf("got %v", cp)
				}
			},
		},
		{
			name: "v1beta2 uses diskFormat", apiVersion: V1Beta2, check: func(t *testing.T, cp map[string]any) {
				img := field(t, cp, "spec", "template", "spec", "image").(map[string]any)
				if field(t, cp, "apiVersion") != V1Beta2 || img["diskFormat"] != "raw" || img["format"] != nil {
					t.Errorf("got %v", cp)
				}
			},
		},
		{
			name: "pass-through fields go where the CRD has them",
			extra: `
control_plane:
  capm3:
    nodeReuse: false
    automatedCleaningMode: metadata
    hostSelector: {matchLabels: {role: cp}, matchExpressions: [{key: rack, operator: In, values: ["1"]}]}
    dataTemplate: {name: dt, kind: Metal3DataTemplate}
`,
			check: func(t *testing.T, cp map[string]any) {
				if field(t, cp, "spec", "nodeReuse") != false {
					t.Error("nodeReuse")
				}
				ts := field(t, cp, "spec", "template", "spec").(map[string]any)
				if ts["automatedCleaningMode"] != "metadata" {
					t.Error("automatedCleaningMode")
				}
				if field(t, cp, "spec", "template", "spec", "hostSelector", "matchLabels", "role") != "cp" {
					t.Error("hostSelector")
				}
				if field(t, cp, "spec", "template", "spec", "dataTemplate", "name") != "dt" {
					t.Error("dataTemplate")
				}
			},
		},
		{
			name: "scheme defaults to https, IPv6 hosts get brackets",
			extra: `
capm3: {image_provisioning_scheme: null, image_provisioning_host: "2001:db8::1"}
`,
			check: func(t *testing.T, cp map[string]any) {
				u := field(t, cp, "spec", "template", "spec", "image", "url").(string)
				if !strings.HasPrefix(u, "https://[2001:db8::1]/images/") {
					t.Errorf("url %s", u)
				}
			},
		},
		{
			name:  "http scheme and a port",
			extra: `capm3: {image_provisioning_scheme: http, image_provisioning_host: "os-images.example.org:8080"}`,
			check: func(t *testing.T, cp map[string]any) {
				u := field(t, cp, "spec", "template", "spec", "image", "url").(string)
				if !strings.HasPrefix(u, "http://os-images.example.org:8080/images/"+sha('a')+"/") {
					t.Errorf("url %s", u)
				}
			},
		},
		{
			name:  "image_key",
			extra: `control_plane: {capm3: {os_image_selector: null, image_key: ubuntu-plain-rke2-1-31}}`,
			check: func(t *testing.T, cp map[string]any) {
				if c := field(t, cp, "spec", "template", "spec", "image", "checksum"); c != sha('d') {
					t.Errorf("checksum %v", c)
				}
			},
		},
		{
			name:  "image_key and a selector that agree",
			extra: `control_plane: {capm3: {image_key: ubuntu-plain-rke2-1-32}}`,
			check: func(t *testing.T, cp map[string]any) {
				if c := field(t, cp, "spec", "template", "spec", "image", "checksum"); c != sha('a') {
					t.Errorf("checksum %v", c)
				}
			},
		},
		{
			name:  "user-set k8s-version is kept",
			extra: `control_plane: {capm3: {os_image_selector: {k8s-version: '1\.31\..*'}}}`,
			check: func(t *testing.T, cp map[string]any) {
				if c := field(t, cp, "spec", "template", "spec", "image", "checksum"); c != sha('d') {
					t.Errorf("checksum %v", c)
				}
			},
		},
		{
			name: "image given by hand, checksum type from the digest length",
			extra: `
control_plane:
  capm3:
    os_image_selector: null
    machine_image_url: https://files.example.org/x.qcow2
    machine_image_checksum: "` + strings.Repeat("0", 128) + `"
    machine_image_format: qcow2
`,
			check: func(t *testing.T, cp map[string]any) {
				img := field(t, cp, "spec", "template", "spec", "image").(map[string]any)
				if img["url"] != "https://files.example.org/x.qcow2" || img["checksumType"] != "sha512" || img["format"] != "qcow2" {
					t.Errorf("image %v", img)
				}
			},
		},
		{
			name: "oci image given by hand has no checksum",
			extra: `
control_plane:
  capm3: {os_image_selector: null, machine_image_url: "oci://registry.example.org/img:1"}
`,
			check: func(t *testing.T, cp map[string]any) {
				img := field(t, cp, "spec", "template", "spec", "image").(map[string]any)
				if len(img) != 1 || img["url"] != "oci://registry.example.org/img:1" {
					t.Errorf("image %v", img)
				}
			},
		},
		{
			name: "checksum URL with its type",
			extra: `
control_plane:
  capm3:
    os_image_selector: null
    machine_image_url: https://files.example.org/x.raw
    machine_image_checksum: https://files.example.org/x.raw.sha256sum
    machine_image_checksum_type: sha256
`,
			check: func(t *testing.T, cp map[string]any) {
				img := field(t, cp, "spec", "template", "spec", "image").(map[string]any)
				if img["checksum"] != "https://files.example.org/x.raw.sha256sum" || img["checksumType"] != "sha256" {
					t.Errorf("image %v", img)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, _ := render(t, Input{Values: vals(t, tt.extra), Catalog: testCatalog(), Served: servedAll(), APIVersion: tt.apiVersion})
			tt.check(t, ts[0].Object)
		})
	}
}

func TestRenderErrors(t *testing.T) {
	notServed := servedAll()
	delete(notServed, osimage.SHA256(sha('b')))
	preparing := servedAll()
	preparing[osimage.SHA256(sha('b'))] = osimage.ServedImage{Available: false, ImageKey: "x"}
	noSHA := testCatalog()
	delete(noSHA["ubuntu-plain-rke2-1-32"], "sha256")
	badImage := testCatalog()
	badImage["ubuntu-plain-rke2-1-32"]["sha256"] = "ABC"
	delete(badImage["ubuntu-plain-rke2-1-32"], "filename")
	badImage["ubuntu-plain-rke2-1-32"]["image-format"] = "iso"

	tests := []struct {
		name       string
		extra      string
		catalog    osimage.Catalog
		served     osimage.ServedSet
		apiVersion string
		namespace  string
		want       []string // substrings, in any order
		not        []string // substrings that must not show
		// pick: every error is a pick or the served check failing (the
		// work, exit 1); otherwise one at least is the input's (exit 2).
		pick bool
	}{
		{
			name: "not served", pick: true, served: notServed,
			want: []string{".machine_deployments.md0.capm3: image " + sha('b') + "/ubuntu-hardened-rke2-1-32 is currently not served by mgmt cluster os-image-server"},
			not:  []string{".control_plane.capm3", "md1"},
		},
		{
			name: "nothing served", pick: true, served: nil,
			want: []string{
				".control_plane.capm3: image " + sha('a') + "/ubuntu-plain-rke2-1-32 is currently not served by mgmt cluster os-image-server",
				".machine_deployments.md0.capm3: image " + sha('b') + "/ubuntu-hardened-rke2-1-32 is currently not served",
				".machine_deployments.md1.capm3: image " + sha('c') + "/opensuse-plain-rke2-1-32 is currently not served",
			},
		},
		{
			name: "still downloading", pick: true, served: preparing,
			want: []string{".machine_deployments.md0.capm3: image " + sha('b') + "/ubuntu-hardened-rke2-1-32 is known to the mgmt cluster os-image-server but not available yet", "still being prepared (downloading)"},
			not:  []string{"currently not served"},
		},
		{name: "no name", extra: `name: null`, want: []string{".name: the cluster name must be set"}},
		{
			name:  "cluster and level errors together",
			extra: "name: null\nmachine_deployments: {md1: {capm3: {os_image_selector: {os: debian}}}}",
			want:  []string{".name: the cluster name must be set", ".machine_deployments.md1.capm3: no OS image could be found matching selectors"},
		},
		{name: "name of the wrong type", extra: `name: {a: b}`, want: []string{".name: must be a string"}},
		{name: "bad name", extra: `name: C_1`, want: []string{".control_plane.capm3: template name \"C_1-cp-", "not a valid object name"}},
		{name: "bad namespace", namespace: "Bad_NS", want: []string{`namespace "Bad_NS"`}},
		{name: "other infra provider", extra: `capi_providers: {infra_provider: capo}`, want: []string{".capi_providers.infra_provider: is \"capo\""}},
		{name: "unknown API version", apiVersion: "v1alpha5", want: []string{`API version "v1alpha5"`}},
		{
			name:  "no image at all",
			pick:  true,
			extra: `capm3: {os_image_selector: null}`,
			want:  []string{".control_plane.capm3: no image: set .os_image_selector, .image_key, or .machine_image_url"},
			not:   []string{"md0", "md1"},
		},
		{
			name:  "manual and selector",
			extra: `machine_deployments: {md1: {capm3: {machine_image_url: "https://x/y.raw", machine_image_checksum: "` + sha('1') + `"}}}`,
			want:  []string{".machine_deployments.md1.capm3: machine_image_checksum, machine_image_url given by hand, and .image_key or .os_image_selector set too"},
		},
		{
			name:  "bad manual image",
			extra: `capm3: {os_image_selector: null, machine_image_url: "x.raw", machine_image_checksum: "abc", machine_image_checksum_type: auto, machine_image_format: iso}`,
			want: []string{
				".control_plane.capm3.machine_image_url: \"x.raw\" is not an absolute URL",
				".control_plane.capm3.machine_image_checksum_type: must be md5, sha256 or sha512, got \"auto\"",
				".control_plane.capm3.machine_image_checksum: 3 hex digits is no md5, sha256 or sha512 digest",
				".control_plane.capm3.machine_image_format: must be one of",
			},
		},
		{
			name:  "checksum type against digest",
			extra: `capm3: {os_image_selector: null, machine_image_url: "https://x/y.raw", machine_image_checksum: "` + sha('1') + `", machine_image_checksum_type: md5}`,
			want:  []string{".control_plane.capm3.machine_image_checksum_type: is md5, but the checksum is a sha256 digest"},
		},
		{
			name:  "manual image without checksum",
			extra: `capm3: {os_image_selector: null, machine_image_url: "https://x/y.raw"}`,
			want:  []string{".control_plane.capm3.machine_image_checksum: must be set"},
		},
		{
			name:  "manual oci image with checksum",
			extra: `capm3: {os_image_selector: null, machine_image_url: "oci://r/i:1", machine_image_checksum: "` + sha('1') + `"}`,
			want:  []string{".control_plane.capm3.machine_image_checksum: must not be set for an oci:// image"},
		},
		{
			name:  "checksum URL without type",
			extra: `capm3: {os_image_selector: null, machine_image_url: "https://x/y.raw", machine_image_checksum: "https://x/y.sha"}`,
			want:  []string{".control_plane.capm3.machine_image_checksum_type: must be set when the checksum is a URL"},
		},
		{
			name:  "image_key and selector differ",
			pick:  true,
			extra: `machine_deployments: {md0: {capm3: {image_key: ubuntu-plain-rke2-1-32}}}`,
			want:  []string{".machine_deployments.md0.capm3: both .os_image_selector and .image_key are set, but the resulting image key differ"},
		},
		{
			name:  "unknown image_key",
			pick:  true,
			extra: `control_plane: {capm3: {os_image_selector: null, image_key: nope}}`,
			want:  []string{".control_plane.capm3: nothing in os_images for image_key nope"},
		},
		{
			name:  "no match",
			pick:  true,
			extra: `machine_deployments: {md1: {capm3: {os_image_selector: {os: debian}}}}`,
			want:  []string{".machine_deployments.md1.capm3: no OS image could be found matching selectors"},
		},
		{
			name:  "unsupported selector key",
			extra: `capm3: {os_image_selector: {size: "1"}}`,
			want:  []string{".control_plane.capm3.os_image_selector: OS selector key 'size': this key is not among the supported base keys"},
		},
		{
			name:  "unknown bootstrap provider",
			extra: `capi_providers: {bootstrap_provider: cabpx}`,
			want:  []string{".control_plane.capm3.os_image_selector: bootstrap provider \"cabpx\""},
		},
		{
			name:  "no k8s_version",
			extra: `k8s_version: null`,
			want:  []string{".control_plane.capm3.os_image_selector: k8s_version is not set"},
		},
		{
			name:  "no host",
			extra: `capm3: {image_provisioning_host: null}`,
			want:  []string{".control_plane.capm3.image_provisioning_host: must be set", ".machine_deployments.md1.capm3.image_provisioning_host: must be set"},
		},
		{
			name:  "bad host and scheme",
			extra: `capm3: {image_provisioning_host: "https://x", image_provisioning_scheme: ftp}`,
			want:  []string{".control_plane.capm3.image_provisioning_host: \"https://x\" must be a host name"},
		},
		{
			name:  "bad scheme",
			extra: `capm3: {image_provisioning_scheme: ftp}`,
			want:  []string{".control_plane.capm3.image_provisioning_scheme: must be http or https, got \"ftp\""},
		},
		{
			name: "picked image lacks sha256", catalog: noSHA,
			want: []string{".control_plane.capm3: os_images.ubuntu-plain-rke2-1-32 has no sha256"},
		},
		{
			name: "picked image malformed", catalog: badImage,
			want: []string{
				".control_plane.capm3: os_images.ubuntu-plain-rke2-1-32: sha256 \"ABC\" is not 64 lowercase hex digits",
				".control_plane.capm3: os_images.ubuntu-plain-rke2-1-32 has no filename",
				".control_plane.capm3: os_images.ubuntu-plain-rke2-1-32: image-format \"iso\" is not one Metal3 accepts",
				".control_plane.capm3: os_images.ubuntu-plain-rke2-1-32 comes from the values' os_images: correct the image's record there (its sha256 is the image file's, 64 lowercase hexadecimal digits as sha256sum prints them",
			},
		},
		{
			name:  "pass-through fields",
			extra: `control_plane: {capm3: {automatedCleaningMode: always, nodeReuse: maybe, hostSelector: {matchlabels: {}}, dataTemplate: x}}`,
			want: []string{
				".control_plane.capm3.automatedCleaningMode: must be metadata or disabled",
				".control_plane.capm3.nodeReuse: must be true or false",
				".control_plane.capm3.hostSelector: unknown field \"matchlabels\"",
				".control_plane.capm3.dataTemplate: must be a map",
			},
		},
		{
			name:  "label value not a string",
			extra: `control_plane: {capm3: {hostSelector: {matchLabels: {rack: 1}}}}`,
			want:  []string{".control_plane.capm3.hostSelector.matchLabels.rack: must be a string"},
		},
		{
			name: "dataTemplate narrowed in v1beta2", apiVersion: V1Beta2,
			extra: `control_plane: {capm3: {dataTemplate: {name: dt, kind: Metal3DataTemplate}}}`,
			want:  []string{".control_plane.capm3.dataTemplate: field \"kind\" is not part of a dataTemplate reference in " + V1Beta2},
		},
		{
			name:  "machine deployment named cp with the control plane's spec",
			extra: `machine_deployments: {cp: {capm3: {}}}`, // no automatedCleaningMode override: differs
			not:   []string{"also the name"},
		},
		{
			name:  "machine deployment named cp collides",
			extra: `machine_deployment_default: {capm3: {automatedCleaningMode: null}}` + "\n" + `machine_deployments: {cp: {capm3: {}}}`,
			want:  []string{".machine_deployments.cp.capm3: template name c1-cp-", "is also the name of the template of .control_plane.capm3"},
		},
		{
			name:  "values of the wrong shape",
			extra: `control_plane: {capm3: [1]}` + "\n" + `machine_deployments: {md0: "x"}`,
			want:  []string{".control_plane.capm3: must be a map", ".machine_deployments.md0: must be a map"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cat := tt.catalog
			if cat == nil {
				cat = testCatalog()
			}
			served := tt.served
			if served == nil && tt.name != "nothing served" {
				served = servedAll()
			}
			ts, err := Render(Input{Values: vals(t, tt.extra), Catalog: cat, Served: served, APIVersion: tt.apiVersion, Namespace: tt.namespace})
			if len(tt.want) == 0 {
				if err != nil {
					msg := err.Error()
					for _, n := range tt.not {
						if strings.Contains(msg, n) {
							t.Fatalf("error %q has %q", msg, n)
						}
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if ts != nil {
				t.Errorf("on error, got %d templates, want none", len(ts))
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q:\n%s", w, msg)
				}
			}
			if InputFault(err) == tt.pick {
				t.Errorf("InputFault = %v, want %v (a pick or served check failing is the work's, anything else the input's):\n%s", !tt.pick, !tt.pick, msg)
			}
			for _, n := range tt.not {
				if strings.Contains(msg, n) {
					t.Errorf("error has %q:\n%s", n, msg)
				}
			}
		})
	}
}

func TestCatalogsFromValues(t *testing.T) {
	v, err := values.Parse([]byte(`
os_images:
  img-a: {sha256: "` + sha('a') + `", size: 12}
capm3_os_image_server_images:
  ` + sha('a') + `: {available: true, image_key: mgmt-a}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b, err := CatalogsFromValues(v)
	if err != nil {
		t.Fatal(err)
	}
	// Kept as YAML gave it, never re-formatted.
	if a["img-a"]["size"] != float64(12) || !b[osimage.SHA256(sha('a'))].Available || b[osimage.SHA256(sha('a'))].ImageKey != "mgmt-a" {
		t.Errorf("got %v %v", a, b)
	}
	v["capm3_os_image_server_images"] = map[string]any{sha('a'): map[string]any{"available": true, "extra": 1}}
	if _, _, err := CatalogsFromValues(v); err == nil || !strings.Contains(err.Error(), ".capm3_os_image_server_images") {
		t.Errorf("unknown served field: err %v", err)
	}
	if a, b, err := CatalogsFromValues(values.Values{}); err != nil || len(a) != 0 || len(b) != 0 {
		t.Errorf("empty values: %v %v %v", a, b, err)
	}
}

// A level's os_image_selector and image_key are set only when they are
// true in a template's sense, after the levels are merged, exactly as
// sylva-library's compute-image-key tests them: {}, false, null and "" are
// "not set". The levels merge as its mergeOverwrite does: a null replaces
// a more general level's value and stays a null.
func TestLevelSemantics(t *testing.T) {
	const unsetRoot = `capm3: {os_image_selector: null}`
	tests := []struct {
		name   string
		extra  []string
		level  string
		want   string // the image key picked, or "" for none
		errHas string // the error, when one is wanted
	}{
		{name: "empty selector with image_key picks the image_key", extra: []string{unsetRoot, `capm3: {os_image_selector: {}, image_key: ubuntu-plain-rke2-1-31}`},
			level: ".control_plane.capm3", want: "ubuntu-plain-rke2-1-31"},
		{name: "empty selector alone designates nothing", extra: []string{unsetRoot, `capm3: {os_image_selector: {}}`}, level: ".control_plane.capm3"},
		{name: "false selector unsets a more general one", extra: []string{`machine_deployments: {md0: {capm3: {os_image_selector: false, image_key: ubuntu-plain-rke2-1-31}}}`},
			level: ".machine_deployments.md0.capm3", want: "ubuntu-plain-rke2-1-31"},
		{name: "null selector unsets a more general one", extra: []string{`machine_deployments: {md0: {capm3: {os_image_selector: null, image_key: ubuntu-plain-rke2-1-31}}}`},
			level: ".machine_deployments.md0.capm3", want: "ubuntu-plain-rke2-1-31"},
		{name: "empty selector merges into a more general one", extra: []string{`machine_deployments: {md0: {capm3: {os_image_selector: {}}}}`},
			level: ".machine_deployments.md0.capm3", want: "ubuntu-hardened-rke2-1-32"},
		{name: "empty image_key is unset", extra: []string{unsetRoot, `capm3: {image_key: ""}`}, level: ".control_plane.capm3"},
		{name: "a null pattern after the merge is refused", extra: []string{`machine_deployments: {md0: {capm3: {os_image_selector: {hardened: null}}}}`},
			level: ".machine_deployments.md0.capm3", errHas: ".machine_deployments.md0.capm3.os_image_selector: OS selector key 'hardened': the pattern must be a string or a boolean, got null"},
		{name: "image_key that is a number", extra: []string{`capm3: {image_key: 123}`}, level: ".control_plane.capm3",
			errHas: ".control_plane.capm3.image_key: must be the key of an image in os_images, got the number 123"},
		{name: "k8s_version that is a number is not re-formatted", extra: []string{`k8s_version: 1.30`}, level: ".control_plane.capm3",
			errHas: ".k8s_version: must be a string (quote it), got the number 1.3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := vals(t, tt.extra...)
			c, err := levels.ChoiceAt(v, tt.level)
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("ChoiceAt: %v, want an error with %q", err, tt.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if c.IsSet() {
					t.Fatalf("choice %+v, want none", c)
				}
				return
			}
			got, err := selector.Resolve(testCatalog(), c.ImageKey, c.Selector, tt.level)
			if err != nil || got != tt.want {
				t.Fatalf("picks %q, %v; want %q", got, err, tt.want)
			}
			// Render agrees (for the one level: the others may not pick).
			if tt.level == ".control_plane.capm3" {
				v = vals(t, append(tt.extra, "machine_deployments: null")...)
			} else {
				v = vals(t, append(tt.extra, "capm3: {os_image_selector: {os: ubuntu}, image_key: null}", "machine_deployments: {md1: null}")...)
			}
			ts, err := Render(Input{Values: v, Catalog: testCatalog(), Served: servedAll()})
			if err != nil {
				t.Fatal(err)
			}
			for _, tmpl := range ts {
				if tmpl.Level == tt.level && tmpl.ImageKey != tt.want {
					t.Errorf("render picks %s, want %s", tmpl.ImageKey, tt.want)
				}
			}
		})
	}
}

// An image record that cannot be served names the input it came from, so
// that the operator corrects it there: the values' own os_images, the
// os-images-info ConfigMap they are merged over, or both.
func TestImageRecordNamesItsInput(t *testing.T) {
	const key = "ubuntu-plain-rke2-1-32"
	cat := testCatalog()
	cat[key]["sha256"] = sha('a')[:63] + "Z"
	const cm = "ConfigMap sylva-system/os-images-info"
	for _, tc := range []struct {
		name, extra, from, want string
	}{
		{"values alone", "", "", "comes from the values' os_images:"},
		{"the ConfigMap", "", cm, "comes from " + cm + ":"},
		{"values over the ConfigMap", "os_images: {" + key + ": {os: ubuntu}}", cm, "comes from the values' os_images merged over " + cm + ":"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(Input{Values: vals(t, tc.extra), Catalog: cat, CatalogFrom: tc.from, Served: servedAll()})
			want := ".control_plane.capm3: os_images." + key + " " + tc.want
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "sha256 \""+sha('a')[:63]+"Z\" is not 64 lowercase hex digits") {
				t.Fatalf("want %q in:\n%v", want, err)
			}
			if !InputFault(err) {
				t.Errorf("a malformed sha256 is not taken as a fault of the input:\n%v", err)
			}
		})
	}
}
