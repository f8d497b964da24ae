package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// orasRepository is oras-go's client of the repository of an image.
func orasRepository(t *testing.T, h *harness, sum osimage.SHA256) *remote.Repository {
	t.Helper()
	repo, err := remote.NewRepository(strings.TrimPrefix(h.http.URL, "http://") + "/" + osimage.OCIRepository(sum))
	if err != nil {
		t.Fatal(err)
	}
	repo.PlainHTTP = true
	return repo
}

func TestOCIClientsGetTheVerifiedImage(t *testing.T) {
	ctx := context.Background()
	src := newFakeSource()
	content1 := bytes.Repeat([]byte("osimages oci "), 40000)
	a := src.add("ubuntu-a", content1, false)
	h := start(t, t.TempDir(), src, nil)
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	repo := orasRepository(t, h, a.SHA256)

	// By tag (the image key), as a registry client resolves it.
	desc, rc, err := repo.FetchReference(ctx, "ubuntu-a")
	if err != nil {
		t.Fatalf("oras fetch by tag: %v", err)
	}
	manifestBytes, err := content.ReadAll(rc, desc)
	rc.Close()
	if err != nil {
		t.Fatalf("reading the manifest (oras checks its digest): %v", err)
	}
	wantBody, wantDigest := osimage.OCIManifest(a.SHA256, int64(len(content1)))
	if desc.Digest != wantDigest || !bytes.Equal(manifestBytes, wantBody) {
		t.Fatalf("manifest %s, want %s (built from sha256 and size alone)", desc.Digest, wantDigest)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(manifestBytes, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 1 || m.Layers[0].Digest.Encoded() != a.SHA256.String() || m.Layers[0].Size != int64(len(content1)) ||
		m.Layers[0].Annotations[ocispec.AnnotationTitle] != osimage.OCILayerTitle(a.SHA256) || m.ArtifactType == "" {
		t.Fatalf("manifest: %s", manifestBytes)
	}
	// By digest, then the layer, verified by the client against its digest.
	if d, err := repo.Resolve(ctx, wantDigest.String()); err != nil || d.Digest != wantDigest {
		t.Fatalf("resolve by digest: %v %v", d, err)
	}
	layer, err := content.FetchAll(ctx, repo.Blobs(), m.Layers[0])
	if err != nil || !bytes.Equal(layer, content1) {
		t.Fatalf("oras blob fetch: %d bytes, %v", len(layer), err)
	}
	if cfg, err := content.FetchAll(ctx, repo.Blobs(), m.Config); err != nil || string(cfg) != "{}" {
		t.Fatalf("config blob: %q %v", cfg, err)
	}
	// The disk-type tags render's oci:// URLs name, and the image's key.
	var tags []string
	if err := repo.Tags(ctx, "", func(page []string) error { tags = append(tags, page...); return nil }); err != nil || fmt.Sprint(tags) != "[qcow2 raw ubuntu-a]" {
		t.Fatalf("tags: %v %v", tags, err)
	}

	// The same image under another filename, key and format keeps its
	// manifest: it is of the bytes alone.
	renamed := a
	renamed.Key = "ubuntu-renamed"
	renamed.Desc.Filename = "other-name.raw"
	h.want(renamed)
	h.waitPhase(a.SHA256, PhaseReady)
	if d, err := repo.Resolve(ctx, "ubuntu-renamed"); err != nil || d.Digest != wantDigest {
		t.Fatalf("a renamed image must keep its manifest digest: %v %v", d, err)
	}
	if _, err := repo.Resolve(ctx, "ubuntu-a"); err == nil {
		t.Fatal("the old key is no longer a tag")
	}

	// Range, HEAD and what a registry must refuse.
	repoPath := "/v2/" + osimage.OCIRepository(a.SHA256)
	path := repoPath + "/blobs/" + m.Layers[0].Digest.String()
	if resp, body := h.get(path, "Range", "bytes=10-19"); resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, content1[10:20]) {
		t.Errorf("Range: %d %q", resp.StatusCode, body)
	}
	if resp, _ := h.get(path, "Range", fmt.Sprintf("bytes=%d-", len(content1))); resp.StatusCode != http.StatusRequestedRangeNotSatisfiable {
		t.Errorf("Range past the end: %d", resp.StatusCode)
	}
	if resp, body := h.do(http.MethodHead, repoPath+"/manifests/"+wantDigest.String()); resp.StatusCode != 200 ||
		resp.Header.Get("Docker-Content-Digest") != wantDigest.String() || resp.Header.Get("Content-Length") != fmt.Sprint(len(wantBody)) || len(body) != 0 {
		t.Errorf("HEAD manifest: %d %v", resp.StatusCode, resp.Header)
	}
	for _, c := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v2/", 200, ""},
		{"GET", "/v2/other/manifests/" + wantDigest.String(), 404, "NAME_UNKNOWN"},
		{"GET", "/v2/images/" + strings.Repeat("0", 64) + "/manifests/" + wantDigest.String(), 404, "NAME_UNKNOWN"},
		{"GET", "/v2/images/" + strings.ToUpper(a.SHA256.String()) + "/manifests/" + wantDigest.String(), 404, "NAME_UNKNOWN"},
		{"GET", "/v2/images/..%2F..%2Fetc/manifests/latest", 404, "NAME_UNKNOWN"},
		{"GET", "/v2/images/" + a.SHA256.String() + "%2F..%2F..%2Fetc/manifests/latest", 404, "NAME_UNKNOWN"},
		{"GET", repoPath + "/manifests/..%2F..%2Fetc%2Fpasswd", 400, "MANIFEST_INVALID"},
		{"GET", repoPath + "/manifests/sha256:" + strings.Repeat("0", 64), 404, "MANIFEST_UNKNOWN"},
		{"GET", repoPath + "/manifests/sha256:nothex", 400, "MANIFEST_INVALID"},
		{"GET", repoPath + "/manifests/never-selected", 404, "MANIFEST_UNKNOWN"},
		{"GET", repoPath + "/blobs/sha256:" + strings.Repeat("1", 64), 404, "BLOB_UNKNOWN"},
		{"GET", repoPath + "/blobs/sha512:" + strings.Repeat("1", 128), 404, "BLOB_UNKNOWN"},
		{"PUT", repoPath + "/manifests/ubuntu-renamed", 405, "UNSUPPORTED"},
		{"DELETE", path, 405, "UNSUPPORTED"},
		{"POST", repoPath + "/blobs/uploads/", 405, "UNSUPPORTED"},
	} {
		resp, body := h.do(c.method, c.path)
		if resp.StatusCode != c.status || c.code != "" && !strings.Contains(string(body), `"code":"`+c.code+`"`) {
			t.Errorf("%s %s: %d %s, want %d %s", c.method, c.path, resp.StatusCode, body, c.status, c.code)
		}
	}
}

// An image being downloaded is reachable by no digest and no tag: its
// bytes are not verified yet. A client is told to come back.
func TestOCIClientsNeverGetAnImageBeingDownloaded(t *testing.T) {
	src := newFakeSource()
	content1 := bytes.Repeat([]byte("in progress "), 30000)
	a := src.add("ubuntu-a", content1, true)
	h := start(t, t.TempDir(), src, nil)
	h.want(a)
	h.waitPhase(a.SHA256, PhaseDownloading)
	manifestBody, manifestDigest := osimage.OCIManifest(a.SHA256, int64(len(content1)))
	repoPath := "/v2/" + osimage.OCIRepository(a.SHA256)
	for _, p := range []string{
		repoPath + "/manifests/ubuntu-a",
		repoPath + "/manifests/" + manifestDigest.String(),
		repoPath + "/blobs/" + osimage.OCILayerDigest(a.SHA256).String(),
	} {
		resp, body := h.get(p)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || bytes.Contains(body, content1[:100]) {
			t.Errorf("%s while downloading: %d, Retry-After %q", p, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	src.release(a.SHA256)
	h.waitPhase(a.SHA256, PhaseReady)
	resp, body := h.get(repoPath + "/blobs/" + osimage.OCILayerDigest(a.SHA256).String())
	if resp.StatusCode != 200 || !bytes.Equal(body, content1) {
		t.Fatalf("once verified: %d, %d bytes", resp.StatusCode, len(body))
	}
	got, err := content.FetchAll(context.Background(), orasRepository(t, h, a.SHA256).Manifests(), ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: manifestDigest, Size: int64(len(manifestBody))})
	if err != nil || !bytes.Equal(got, manifestBody) {
		t.Fatalf("the manifest by digest once verified: %v", err)
	}
}

// The output gives each available image's OCI reference, the one the
// server answers, and none while the image is not available.
func TestOutputGivesTheOCIReferenceOfAvailableImages(t *testing.T) {
	src := newFakeSource()
	content1 := bytes.Repeat([]byte("published "), 50000)
	a := src.add("ubuntu-a", content1, true)
	pub := &recordingPublisher{}
	h := start(t, t.TempDir(), src, func(c *Config) { c.Publisher = pub })
	h.want(a)
	h.waitPhase(a.SHA256, PhaseDownloading)
	testenv.Poll(t, "the image published, not available", 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		out := pub.output()
		_, ok := out.Set[a.SHA256]
		return ok, fmt.Sprint(out)
	})
	if ref, ok := pub.output().OCI[a.SHA256]; ok {
		t.Fatalf("an image being downloaded has an OCI reference in the output: %v", ref)
	}
	src.release(a.SHA256)
	var ref osimage.OCIServed
	testenv.Poll(t, "the OCI reference published", 10*time.Second, 5*time.Millisecond, func() (bool, string) {
		out := pub.output()
		ref = out.OCI[a.SHA256]
		return out.Set[a.SHA256].Available && ref.Manifest != "", fmt.Sprint(out)
	})
	_, want := osimage.OCIManifest(a.SHA256, int64(len(content1)))
	if ref.Repository != osimage.OCIRepository(a.SHA256) || ref.Manifest != want {
		t.Fatalf("published %+v, want repository %s and manifest %s", ref, osimage.OCIRepository(a.SHA256), want)
	}
	if resp, _ := h.get("/v2/" + ref.Repository + "/manifests/" + ref.Manifest.String()); resp.StatusCode != http.StatusOK {
		t.Errorf("the published reference answers %d", resp.StatusCode)
	}
}
