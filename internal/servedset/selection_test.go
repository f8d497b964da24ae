package servedset

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

func hexSum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func testCatalog() osimage.Catalog {
	img := func(key, os, hardened, k8s string) osimage.Image {
		return osimage.Image{"sha256": hexSum(key), "filename": key + ".raw", "image-format": "raw", "os": os,
			"hardened": hardened, "k8s-flavor": "rke2", "k8s-version": k8s, "oci-image-registry-key": "sylva"}
	}
	return osimage.Catalog{
		"ubuntu-plain-132":    img("ubuntu-plain-132", "ubuntu", "false", "1.32.5+rke2r1"),
		"ubuntu-hardened-132": img("ubuntu-hardened-132", "ubuntu", "true", "1.32.5+rke2r1"),
		"ubuntu-plain-131":    img("ubuntu-plain-131", "ubuntu", "false", "1.31.9+rke2r1"),
		"leap-plain-131":      img("leap-plain-131", "leapmicro", "false", "1.31.9+rke2r1"),
		// Same file under a second key: served once.
		"alias-ubuntu-plain-132": img("ubuntu-plain-132", "ubuntu-alias", "false", "1.32.5+rke2r1"),
	}
}

func mgmtValues(t *testing.T, extra string) values.Values {
	t.Helper()
	v, err := values.Parse([]byte(`
name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {os: ubuntu, hardened: false}
  image_provisioning_host: 192.0.2.10
` + extra))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func keys(w map[osimage.SHA256]Wanted) []string {
	var out []string
	for _, x := range w {
		out = append(out, x.Key)
	}
	slices.Sort(out)
	return out
}

func TestSelect(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         []string
		wantErr      string
	}{
		{"own finalized selector only", "", []string{"ubuntu-plain-132"}, ""},
		{"additional selectors are not finalized", `
os_image_server_additional_selectors:
  older-workload-clusters: {os: ubuntu, k8s-version: '1\.31\..*'}
  leap: {os: leapmicro}`, []string{"leap-plain-131", "ubuntu-plain-131", "ubuntu-plain-132"}, ""},
		{"machine deployment levels count", `
machine_deployments:
  md0: {capm3: {os_image_selector: {hardened: true}}}`, []string{"ubuntu-hardened-132", "ubuntu-plain-132"}, ""},
		{"image_key level", `
control_plane: {capm3: {os_image_selector: null, image_key: leap-plain-131}}
machine_deployments: {md0: {capm3: {}}}`, []string{"leap-plain-131", "ubuntu-plain-132"}, ""},
		{"a bad additional selector does not stop the others", `
os_image_server_additional_selectors:
  bad: {colour: blue}
  leap: {os: leapmicro}`, []string{"leap-plain-131", "ubuntu-plain-132"}, "OS selector key 'colour': this key is not among the supported base keys"},
		{"unknown image_key", `
control_plane: {capm3: {os_image_selector: null, image_key: nope}}
machine_deployments: {md0: {capm3: {}}}`, []string{"ubuntu-plain-132"}, "nothing in os_images for image_key nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Select(mgmtValues(t, tc.values), testCatalog())
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v does not contain %q", err, tc.wantErr)
			}
			if k := keys(got); strings.Join(k, ",") != strings.Join(tc.want, ",") {
				t.Errorf("selected %v, want %v", k, tc.want)
			}
			for sum, w := range got {
				if w.SHA256 != sum || w.Desc.Filename != w.Key+".raw" || len(w.SelectedBy) == 0 {
					t.Errorf("entry %s: %+v", sum, w)
				}
			}
		})
	}
}

func TestSelectDedupesBySHA256(t *testing.T) {
	got, err := Select(mgmtValues(t, `
os_image_server_additional_selectors:
  alias: {os: ubuntu-alias}`), testCatalog())
	if err != nil {
		t.Fatal(err)
	}
	w, ok := got[osimage.SHA256(hexSum("ubuntu-plain-132"))]
	if len(got) != 1 || !ok || w.Key != "alias-ubuntu-plain-132" || len(w.SelectedBy) != 2 {
		t.Errorf("one file under two keys: %+v", got)
	}
}

func TestSelectRefusesUnservableImages(t *testing.T) {
	cat := testCatalog()
	cat["ubuntu-plain-132"]["filename"] = "../../etc/passwd"
	cat["ubuntu-plain-131"]["sha256"] = ""
	got, err := Select(mgmtValues(t, `
os_image_server_additional_selectors:
  all: {os: ubuntu}`), cat)
	if err == nil || !strings.Contains(err.Error(), "plain file name") || !strings.Contains(err.Error(), "no valid sha256") {
		t.Fatalf("want both images refused, got %v", err)
	}
	if k := slices.Sorted(maps.Keys(got)); len(k) != 1 || got[k[0]].Key != "ubuntu-hardened-132" {
		t.Errorf("selected %v", keys(got))
	}
}

// TestSelectServesEveryFilenameOfTheSHA256 is the scenario of a key that
// sorts first, with the same sha256 and another filename: the first
// filename stays served.
func TestSelectServesEveryFilenameOfTheSHA256(t *testing.T) {
	cat := testCatalog()
	renamed := cat["ubuntu-plain-132"].Clone()
	renamed["filename"] = "renamed.raw"
	cat["a-renamed"] = renamed
	// Not selected itself, but naming the same file: served under its
	// filename too. A bad filename is never served.
	unselected := cat["ubuntu-plain-132"].Clone()
	unselected["os"], unselected["filename"] = "other", "third.raw"
	cat["z-unselected"] = unselected
	bad := cat["ubuntu-plain-132"].Clone()
	bad["os"], bad["filename"] = "other", "../x"
	cat["z-bad"] = bad

	got, err := Select(mgmtValues(t, ""), cat)
	if err != nil {
		t.Fatal(err)
	}
	w := got[osimage.SHA256(hexSum("ubuntu-plain-132"))]
	if want := []string{"renamed.raw", "third.raw", "ubuntu-plain-132.raw"}; strings.Join(w.Filenames, ",") != strings.Join(want, ",") {
		t.Errorf("filenames %v, want %v", w.Filenames, want)
	}
}

func TestBoundsOfAWantedImage(t *testing.T) {
	for _, tc := range []struct {
		size, archive     string
		bound, need       int64
		refused, declares bool
	}{
		{size: "100", archive: "40", bound: 100, need: 140, declares: true},
		{size: "", archive: "40", bound: 1000, need: 1040},
		{size: "1001", refused: true, declares: true},
		{size: "-1", refused: true},
		{size: "100", archive: "9223372036854775807", bound: 100, need: 1<<63 - 1, declares: true},
	} {
		w := Wanted{Key: "k", Desc: osimage.Image{osimage.FieldSize: tc.size, osimage.FieldArchiveSize: tc.archive}.Descriptor()}
		bound, need, err := w.Bounds(1000)
		if (err != nil) != tc.refused || bound != tc.bound || need != tc.need || (w.Desc.Size > 0) != tc.declares {
			t.Errorf("size %q archive %q: %d %d %v declares %v; want %d %d refused %v declares %v",
				tc.size, tc.archive, bound, need, err, w.Desc.Size > 0, tc.bound, tc.need, tc.refused, tc.declares)
		}
		if err != nil && !strings.Contains(err.Error(), "os_images.k.") {
			t.Errorf("size %q: %v does not name the image", tc.size, err)
		}
	}
}
