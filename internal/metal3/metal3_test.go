package metal3

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestImageSHA256(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	cases := []struct {
		img  Image
		want string
	}{
		{Image{URL: "https://h/x.raw", Checksum: sha, ChecksumType: "sha256"}, sha},
		// One spelling of a sha256 (osimage.ParseSHA256), as the server's.
		{Image{URL: "https://h/x.raw", Checksum: strings.ToUpper(sha)}, ""},
		{Image{URL: "https://h/images/" + strings.ToUpper(sha) + "/ubuntu.raw"}, ""},
		{Image{URL: "https://h/images/" + sha + "/a%20b%23c.raw"}, sha},
		{Image{URL: "https://h/images/" + sha + "/a%2Fb.raw"}, ""},
		{Image{URL: "https://h/images/" + sha + "/ubuntu.raw.sha256sum", Checksum: "https://h/images/" + sha + "/ubuntu.raw.sha256sum"}, sha},
		{Image{URL: "https://h:8080/images/" + sha + "/ubuntu.raw", Checksum: strings.Repeat("a", 32), ChecksumType: "md5"}, sha},
		{Image{URL: "https://h/x.raw", Checksum: strings.Repeat("a", 32), ChecksumType: "md5"}, ""},
		{Image{URL: "https://h/images/" + sha + "/a/b.raw"}, ""},
		{Image{URL: "https://h/x.raw", Checksum: "https://h/x.raw.sha256sum", ChecksumType: "sha256"}, ""},
		// A template whose image URL points elsewhere (a cache, a mirror)
		// but whose checksum is fetched from osimages still needs the image.
		{Image{URL: "https://mirror/x.raw", Checksum: "http://osimages:8080/images/" + sha + "/ubuntu.raw.sha256sum", ChecksumType: "sha256"}, sha},
		{Image{URL: "https://mirror/x.raw", Checksum: "http://osimages:8080/images/" + sha + "/ubuntu.raw.md5sum", ChecksumType: "md5"}, sha},
		// An osimages oci:// URL names its image by its repository.
		{Image{URL: "oci://osimages:8443/images/" + sha + "@sha256:" + strings.Repeat("cd", 32)}, sha},
		{Image{URL: "oci://osimages:8443/images/" + sha + ":ubuntu"}, ""},
		{Image{URL: "oci://registry/dib/ubuntu@sha256:" + sha}, ""},
	}
	for _, tc := range cases {
		got, ok := tc.img.SHA256()
		if string(got) != tc.want || ok != (tc.want != "") {
			t.Errorf("%+v: got %q %v, want %q", tc.img, got, ok, tc.want)
		}
	}
}

func TestImageOfBothKinds(t *testing.T) {
	tmpl := &unstructured.Unstructured{Object: map[string]any{"kind": KindMachineTemplate,
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"image": map[string]any{"url": "u", "checksum": "c"}}}}}}
	machine := &unstructured.Unstructured{Object: map[string]any{"kind": KindMachine,
		"spec": map[string]any{"image": map[string]any{"url": "u2", "checksum": "c2"}}}}
	if img, ok := ImageOf(tmpl); !ok || img.URL != "u" {
		t.Errorf("template: %+v %v", img, ok)
	}
	if img, ok := ImageOf(machine); !ok || img.Checksum != "c2" {
		t.Errorf("machine: %+v %v", img, ok)
	}
	if _, ok := ImageOf(&unstructured.Unstructured{Object: map[string]any{"kind": KindMachine}}); ok {
		t.Error("no image block must give none")
	}
	slim := SlimObject(tmpl.DeepCopy(), KindMachineTemplate).(*unstructured.Unstructured)
	if img, ok := ImageOf(slim); !ok || img.URL != "u" {
		t.Errorf("slimmed template lost its image: %+v", slim.Object)
	}
}
