package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry"
)

// registryServer is a registry on 127.0.0.1 that answers with what the
// test gives it, and counts the requests for each path.
type registryServer struct {
	srv      *httptest.Server
	requests atomic.Int64
	// handle answers a request under /v2/<repo>/; nil: 404.
	handle func(w http.ResponseWriter, r *http.Request)
}

func newRegistry(t *testing.T, tls bool) *registryServer {
	t.Helper()
	s := &registryServer{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			w.WriteHeader(http.StatusOK)
			return
		}
		s.requests.Add(1)
		if s.handle == nil {
			http.NotFound(w, r)
			return
		}
		s.handle(w, r)
	})
	if tls {
		s.srv = httptest.NewTLSServer(h)
	} else {
		s.srv = httptest.NewServer(h)
	}
	t.Cleanup(s.srv.Close)
	return s
}

func (s *registryServer) host() string {
	return strings.TrimPrefix(strings.TrimPrefix(s.srv.URL, "https://"), "http://")
}

// insecure is a client that accepts the test server's certificate and
// plain HTTP, as oci_registry_insecure does.
func insecure(t *testing.T) *Client {
	t.Helper()
	c, err := NewClient(Options{Insecure: true, RegistryConfig: writeConfig(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// manifest serves body as the manifest of every tag, announcing digest
// (the body's own when empty) and size.
func manifest(body []byte, announced digest.Digest, size int) func(http.ResponseWriter, *http.Request) {
	if announced == "" {
		announced = digest.FromBytes(body)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/manifests/") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
		w.Header().Set("Docker-Content-Digest", announced.String())
		w.Header().Set("Content-Length", fmt.Sprint(size))
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(body)
	}
}

func TestParseReference(t *testing.T) {
	for _, ok := range []string{"oci://registry.example/sylva/ubuntu:1.0", "registry.example:5000/a/b@sha256:" + strings.Repeat("a", 64)} {
		if _, err := ParseReference(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if _, err := ParseReference("oci://registry.example/sylva/ubuntu"); err == nil || !strings.Contains(err.Error(), `"oci://registry.example/sylva/ubuntu" names no tag or digest`) {
		t.Errorf("no tag: %v", err)
	}
	if _, err := ParseReference("oci://Registry Example/x:1"); err == nil {
		t.Error("a reference with a space parsed")
	}
}

func TestFetchManifest(t *testing.T) {
	good, err := json.Marshal(ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: ocispec.DescriptorEmptyJSON, Layers: []ocispec.Descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", Digest: digest.FromString("layer"), Size: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Run("good", func(t *testing.T) {
		reg := newRegistry(t, true)
		reg.handle = manifest(good, "", len(good))
		m, err := insecure(t).FetchManifest(ctx, "oci://"+reg.host()+"/sylva/ubuntu:1.0")
		if err != nil {
			t.Fatal(err)
		}
		if m.Descriptor.Digest != digest.FromBytes(good) || len(m.Layers) != 1 || m.Layers[0].Size != 5 {
			t.Errorf("manifest %+v", m)
		}
	})
	t.Run("bytes that do not match the digest", func(t *testing.T) {
		reg := newRegistry(t, true)
		reg.handle = manifest(good, digest.FromString("something else"), len(good))
		if _, err := insecure(t).FetchManifest(ctx, "oci://"+reg.host()+"/sylva/ubuntu:1.0"); err == nil {
			t.Fatal("a manifest whose bytes do not match its digest was accepted")
		}
	})
	t.Run("announced larger than a manifest can be", func(t *testing.T) {
		reg := newRegistry(t, true)
		reg.handle = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
			w.Header().Set("Docker-Content-Digest", digest.FromString("x").String())
			w.Header().Set("Content-Length", fmt.Sprint(maxManifestBytes+1))
			// The body never comes: the size alone is refused.
		}
		_, err := insecure(t).FetchManifest(ctx, "oci://"+reg.host()+"/sylva/ubuntu:1.0")
		if err == nil || !strings.Contains(err.Error(), "more than the 4194304 an image manifest can be") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("not JSON", func(t *testing.T) {
		reg := newRegistry(t, true)
		body := []byte("<html>not a manifest</html>")
		reg.handle = manifest(body, "", len(body))
		_, err := insecure(t).FetchManifest(ctx, "oci://"+reg.host()+"/sylva/ubuntu:1.0")
		if err == nil || !strings.Contains(err.Error(), "is not JSON") || !strings.Contains(err.Error(), digest.FromBytes(body).String()) {
			t.Fatalf("%v", err)
		}
	})
}

// TestReadBlobBounds: a descriptor larger than the bound is refused
// before any request; a blob whose bytes are not its digest's is refused.
func TestReadBlobBounds(t *testing.T) {
	ctx := context.Background()
	reg := newRegistry(t, true)
	content := []byte(`{"config": "small"}`)
	lie := false
	reg.handle = func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/blobs/") {
			http.NotFound(w, r)
			return
		}
		body := content
		if lie {
			body = []byte(`{"config": "LARGE"}`)
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body)
	}
	c := insecure(t)
	ref := registry.Reference{Registry: reg.host(), Repository: "sylva/ubuntu", Reference: "1.0"}
	desc := ocispec.Descriptor{MediaType: "application/json", Digest: digest.FromBytes(content), Size: int64(len(content))}

	got, err := c.ReadBlob(ctx, ref, desc, 1024)
	if err != nil || string(got) != string(content) {
		t.Fatalf("%q %v", got, err)
	}
	before := reg.requests.Load()
	big := desc
	big.Size = 1 << 30
	if _, err := c.ReadBlob(ctx, ref, big, 1024); err == nil || !strings.Contains(err.Error(), "announced as 1073741824 bytes, more than the 1024 allowed") {
		t.Errorf("a blob announced too large: %v", err)
	}
	if _, err := c.ReadBlob(ctx, ref, ocispec.Descriptor{Digest: "sha256:short", Size: 1}, 1024); err == nil || !strings.Contains(err.Error(), `blob digest "sha256:short"`) {
		t.Errorf("a malformed digest: %v", err)
	}
	if n := reg.requests.Load() - before; n != 0 {
		t.Errorf("%d requests for blobs refused in advance", n)
	}
	lie = true
	if _, err := c.ReadBlob(ctx, ref, desc, 1024); err == nil {
		t.Error("a blob whose bytes are not its digest's was accepted")
	}
}

// TestGetBlobPassesTheRangeAndFallsBackToPlainHTTP: an insecure client
// reaches a plain-HTTP registry, remembers it (BlobURL says http), and
// sends the caller's headers; a malformed digest is refused unsent.
func TestGetBlobPassesTheRangeAndFallsBackToPlainHTTP(t *testing.T) {
	reg := newRegistry(t, false)
	var gotRange atomic.Value
	reg.handle = func(w http.ResponseWriter, r *http.Request) {
		gotRange.Store(r.Header.Get("Range"))
		w.WriteHeader(http.StatusPartialContent)
		_, _ = w.Write([]byte("tail"))
	}
	c := insecure(t)
	ref := registry.Reference{Registry: reg.host(), Repository: "sylva/ubuntu", Reference: "1.0"}
	d := digest.FromString("blob")
	if u := c.BlobURL(ref, d); !strings.HasPrefix(u, "https://") {
		t.Errorf("before any answer, BlobURL is %s, want https", u)
	}
	resp, err := c.GetBlob(context.Background(), ref, d, http.Header{"Range": {"bytes=10-13"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || gotRange.Load() != "bytes=10-13" {
		t.Errorf("status %d, range sent %v", resp.StatusCode, gotRange.Load())
	}
	if u := c.BlobURL(ref, d); u != "http://"+reg.host()+"/v2/sylva/ubuntu/blobs/"+d.String() {
		t.Errorf("after the fallback, BlobURL is %s", u)
	}
	if _, err := c.GetBlob(context.Background(), ref, "sha256:nope", nil); err == nil || !strings.Contains(err.Error(), `blob digest "sha256:nope"`) {
		t.Errorf("a malformed digest: %v", err)
	}
	// The secure client never falls back.
	secure, err := NewClient(Options{RegistryConfig: writeConfig(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secure.GetBlob(context.Background(), ref, d, nil); err == nil {
		t.Error("the secure client reached a plain-HTTP registry")
	}
}

// TestReferrersBounded: a registry listing more referrers than osimages
// reads gives the first MaxReferrers and ErrTooManyReferrers.
func TestReferrersBounded(t *testing.T) {
	for _, n := range []int{3, MaxReferrers + 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			reg := newRegistry(t, true)
			reg.handle = func(w http.ResponseWriter, r *http.Request) {
				if !strings.Contains(r.URL.Path, "/referrers/") {
					http.NotFound(w, r)
					return
				}
				idx := ocispec.Index{MediaType: ocispec.MediaTypeImageIndex}
				idx.SchemaVersion = 2
				for i := range n {
					idx.Manifests = append(idx.Manifests, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: "application/vnd.dev.cosign.artifact.sig.v1+json",
						Digest: digest.FromString(fmt.Sprint(i)), Size: 100})
				}
				w.Header().Set("Content-Type", ocispec.MediaTypeImageIndex)
				_ = json.NewEncoder(w).Encode(idx)
			}
			ref := registry.Reference{Registry: reg.host(), Repository: "sylva/ubuntu", Reference: "1.0"}
			subject := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("subject"), Size: 10}
			got, err := insecure(t).Referrers(context.Background(), ref, subject, "")
			if n <= MaxReferrers {
				if err != nil || len(got) != n {
					t.Fatalf("%d referrers, %v; want %d", len(got), err, n)
				}
				return
			}
			if !errors.Is(err, ErrTooManyReferrers) || !strings.Contains(err.Error(), subject.Digest.String()) {
				t.Fatalf("error %v, want ErrTooManyReferrers naming the subject", err)
			}
			if len(got) != MaxReferrers {
				t.Errorf("%d referrers returned, want the first %d", len(got), MaxReferrers)
			}
		})
	}
}
