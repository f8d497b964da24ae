package ocidist

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
)

var sumA = osimage.SHA256(strings.Repeat("a", 64))

type images []Image

func (i images) Image(sum osimage.SHA256) (Image, bool) {
	for _, img := range i {
		if img.SHA256 == sum {
			return img, true
		}
	}
	return Image{}, false
}

func TestTagListPages(t *testing.T) {
	reg := Registry{Images: images{
		{SHA256: sumA, Ready: true, Size: 1, Tags: []string{"c", "a", "b", "a"}},
		{SHA256: osimage.SHA256(strings.Repeat("b", 64)), Tags: []string{"d"}},
	}}
	srv := httptest.NewServer(reg.Handler())
	defer srv.Close()
	get := func(query string) (tagList, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/v2/" + osimage.OCIRepository(sumA) + "/tags/list" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l tagList
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", query, resp.StatusCode, err)
		}
		return l, resp.Header.Get("Link")
	}
	// The disk types' tags are every image's, beside its keys.
	if l, link := get(""); strings.Join(l.Tags, ",") != "a,b,c,qcow2,raw" || l.Name != "images/"+string(sumA) || link != "" {
		t.Errorf("all tags: %+v %q", l, link)
	}
	l, link := get("?n=2")
	if strings.Join(l.Tags, ",") != "a,b" || !strings.Contains(link, "last=b") || !strings.Contains(link, `rel="next"`) {
		t.Errorf("first page: %+v %q", l, link)
	}
	if l, link := get("?n=2&last=b"); strings.Join(l.Tags, ",") != "c,qcow2" || !strings.Contains(link, "last=qcow2") {
		t.Errorf("second page: %+v %q", l, link)
	}
	if l, link := get("?n=2&last=qcow2"); strings.Join(l.Tags, ",") != "raw" || link != "" {
		t.Errorf("last page: %+v %q", l, link)
	}
	if l, _ := get("?last=zzz"); l.Tags == nil || len(l.Tags) != 0 {
		t.Errorf("past the last tag: %+v (want an empty list, not null)", l)
	}
	if resp, err := http.Get(srv.URL + "/v2/" + osimage.OCIRepository(sumA) + "/tags/list?n=-1"); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("n=-1: %v %v", resp.StatusCode, err)
	}
}

// TestADiskTypeTagAnswersAnIndex: the tags raw and qcow2 of every image
// answer an index whose one manifest is the image's, annotated with the
// disk type where Ironic reads it; the index is also reachable by its
// digest, a key's tag still answers the manifest, and the tag form of
// the reference reads back.
func TestADiskTypeTagAnswersAnIndex(t *testing.T) {
	reg := Registry{Images: images{{SHA256: sumA, Ready: true, Size: 42, Tags: []string{"ubuntu"}}}}
	srv := httptest.NewServer(reg.Handler())
	defer srv.Close()
	fetch := func(ref string) (*http.Response, []byte) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/v2/" + osimage.OCIRepository(sumA) + "/manifests/" + ref)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp, []byte(b.String())
	}
	manifest, md := osimage.OCIManifest(sumA, 42)
	for _, diskType := range osimage.OCIDiskTypes {
		want, id := osimage.OCIIndex(sumA, 42, diskType)
		for _, ref := range []string{diskType, id.String()} {
			resp, body := fetch(ref)
			if resp.StatusCode != http.StatusOK || string(body) != string(want) || resp.Header.Get("Content-Type") != ocispec.MediaTypeImageIndex || resp.Header.Get("Docker-Content-Digest") != id.String() {
				t.Fatalf("manifests/%s: %s %s %q, want the index %s", ref, resp.Status, resp.Header.Get("Content-Type"), body, want)
			}
		}
		var idx ocispec.Index
		if err := json.Unmarshal(want, &idx); err != nil {
			t.Fatal(err)
		}
		if len(idx.Manifests) != 1 || idx.Manifests[0].Digest != md || idx.Manifests[0].Size != int64(len(manifest)) ||
			idx.Manifests[0].MediaType != ocispec.MediaTypeImageManifest || idx.Manifests[0].Annotations["disktype"] != diskType {
			t.Errorf("index of %s: %s", diskType, want)
		}
		ref := osimage.OCIReference{Host: "10.0.0.1:8443", SHA256: sumA, DiskType: diskType}
		if got := ref.String(); got != "oci://10.0.0.1:8443/images/"+string(sumA)+":"+diskType {
			t.Errorf("reference %s", got)
		}
		if back, ok := osimage.ParseOCIReference(ref.String()); !ok || back != ref {
			t.Errorf("the reference does not read back: %+v %v", back, ok)
		}
	}
	if resp, body := fetch("ubuntu"); resp.StatusCode != http.StatusOK || string(body) != string(manifest) {
		t.Errorf("a key's tag: %s %q, want the manifest", resp.Status, body)
	}
	if resp, _ := fetch("vmdk"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a disk type Ironic does not know: %s, want 404", resp.Status)
	}
}
