package devregistry

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"github.com/sylva-projects/osimages/internal/osimage"
)

func startRegistry(t *testing.T, opts Options) *Registry {
	t.Helper()
	reg, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}

func fetchManifest(t *testing.T, repo *remote.Repository, ref string) (ocispec.Descriptor, ocispec.Manifest) {
	t.Helper()
	desc, rc, err := repo.FetchReference(context.Background(), ref)
	if err != nil {
		t.Fatalf("fetching %s: %v", ref, err)
	}
	defer rc.Close()
	var m ocispec.Manifest
	if err := json.NewDecoder(rc).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return desc, m
}

// Publish, read back over the socket with oras-go: the manifest is a
// diskimage-builder artifact whose annotations are the fields (Fields
// winning over the computed ones), its layer is the gzip of the content
// under the file's title, republishing the same image gives the same
// digest, and NoAnnotations publishes none of the fields.
func TestPublishRoundTrip(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, Options{})
	data := DiskContent(1<<20+77, 5)
	p, err := reg.Publish(ctx, DiskImage{Repository: "dib/ubuntu-noble", Tag: "1.0", Content: data, Gzip: true,
		Fields: osimage.Image{osimage.FieldImageFormat: "qcow2", "release": "noble"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Ref != reg.Host+"/dib/ubuntu-noble:1.0" {
		t.Errorf("ref %s", p.Ref)
	}
	sum := sha256.Sum256(data)
	if p.Fields.Get(osimage.FieldSHA256) != digest.FromBytes(data).Encoded() || p.Fields.Get(osimage.FieldSHA256) != hex.EncodeToString(sum[:]) {
		t.Errorf("sha256 field %s", p.Fields.Get(osimage.FieldSHA256))
	}
	repo, err := reg.Repository("dib/ubuntu-noble")
	if err != nil {
		t.Fatal(err)
	}
	desc, m := fetchManifest(t, repo, "1.0")
	if desc.Digest != p.ManifestDigest || m.ArtifactType != ArtifactType || len(m.Layers) != 1 {
		t.Fatalf("manifest %s %+v: want %s, artifact type %s, one layer", desc.Digest, m, p.ManifestDigest, ArtifactType)
	}
	want := map[string]string{
		"image-format": "qcow2", "release": "noble", "filename": "ubuntu-noble.raw", "compression": "gz",
		"sha256": p.Fields.Get("sha256"), "size": "1048653", "archive-size": p.Fields.Get("archive-size"),
	}
	for k, v := range want {
		if got := m.Annotations[osimage.AnnotationPrefix+k]; got != v {
			t.Errorf("annotation %s = %q, want %q", k, got, v)
		}
	}
	if fields := osimage.FieldsFromAnnotations(m.Annotations); fields.Get(osimage.FieldMD5) != p.Fields.Get(osimage.FieldMD5) {
		t.Errorf("annotated fields %v, published %v", fields, p.Fields)
	}
	layer := m.Layers[0]
	if layer.MediaType != ocispec.MediaTypeImageLayerGzip || layer.Annotations[ocispec.AnnotationTitle] != "ubuntu-noble.raw.gz" || layer.Digest != p.LayerDigest {
		t.Errorf("layer %+v", layer)
	}
	rc, err := repo.Blobs().Fetch(ctx, layer)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(content.NewVerifyReader(rc, layer))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(zr)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("layer gunzips to %d bytes, %v", len(got), err)
	}

	again, err := reg.Publish(ctx, DiskImage{Repository: "dib/ubuntu-noble", Tag: "1.0-again", Content: data, Gzip: true,
		Fields: osimage.Image{osimage.FieldImageFormat: "qcow2", "release": "noble"}})
	if err != nil || again.ManifestDigest != p.ManifestDigest {
		t.Errorf("republished as %s, %v: want the same digest %s", again.ManifestDigest, err, p.ManifestDigest)
	}

	bare, err := reg.Publish(ctx, DiskImage{Repository: "dib/ubuntu-noble", Tag: "bare", Content: data, NoAnnotations: true})
	if err != nil {
		t.Fatal(err)
	}
	_, m = fetchManifest(t, repo, "bare")
	if len(bare.Fields) != 0 || len(m.Annotations) != 1 || m.Annotations[ocispec.AnnotationCreated] == "" {
		t.Errorf("NoAnnotations: fields %v, annotations %v: want only the creation time", bare.Fields, m.Annotations)
	}
	if m.Layers[0].MediaType != ocispec.MediaTypeImageLayer || m.Layers[0].Size != int64(len(data)) {
		t.Errorf("raw layer %+v", m.Layers[0])
	}
}

// The registry answers a Range request of a blob with 206 and those bytes,
// as a resumed download needs.
func TestBlobRange(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, Options{})
	data := DiskContent(300<<10, 8)
	p, err := reg.Publish(ctx, DiskImage{Repository: "dib/range", Tag: "1", Content: data})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		header     string
		start, end int
	}{{"bytes=1000-1999", 1000, 2000}, {"bytes=200000-", 200000, len(data)}, {"bytes=-10", len(data) - 10, len(data)}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, reg.URL()+"/v2/dib/range/blobs/"+p.LayerDigest.String(), nil)
		req.Header.Set("Range", tc.header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, data[tc.start:tc.end]) {
			t.Errorf("%s: %d, %d bytes, %v: want 206 and bytes %d-%d", tc.header, resp.StatusCode, len(body), err, tc.start, tc.end)
		}
	}
}

// The registry checks what it is given: a blob whose bytes are not its
// digest is refused and not stored, a manifest whose layer was never pushed
// is refused, and an unknown manifest digest is not found.
func TestWrongDigestsRefused(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, Options{})
	repo, err := reg.Repository("dib/strict")
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("the bytes of an image")
	lying := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromString("other bytes"), Size: int64(len(body))}
	if err := repo.Push(ctx, lying, bytes.NewReader(body)); err == nil {
		t.Error("a blob pushed under another digest was accepted")
	}
	if ok, err := repo.Exists(ctx, lying); ok || err != nil {
		t.Errorf("the lying blob exists: %v, %v", ok, err)
	}

	missing := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromBytes(body), Size: int64(len(body))}
	config := []byte("{}")
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: 2}
	if err := repo.Push(ctx, configDesc, bytes.NewReader(config)); err != nil {
		t.Fatal(err)
	}
	manifest, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: configDesc, Layers: []ocispec.Descriptor{missing}})
	mdesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(manifest), Size: int64(len(manifest))}
	if err := repo.Push(ctx, mdesc, bytes.NewReader(manifest)); err == nil || !strings.Contains(err.Error(), "blob unknown") || !strings.Contains(err.Error(), missing.Digest.String()) {
		t.Errorf("a manifest of a layer never pushed: %v, want the layer's blob unknown", err)
	}
	if _, err := repo.Resolve(ctx, digest.FromString("no such manifest").String()); !errors.Is(err, errdef.ErrNotFound) {
		t.Errorf("an unknown manifest: %v, want not found", err)
	}
}

// With TLS and credentials, the registry's own client publishes and reads;
// a client that does not trust its CA, or carries no or wrong credentials,
// is refused; Close removes the CA file.
func TestTLSAndBasicAuth(t *testing.T) {
	ctx := context.Background()
	reg, err := Start(ctx, Options{TLS: true, Username: "sylva", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if !strings.HasPrefix(reg.URL(), "https://127.0.0.1:") {
		t.Errorf("URL %s", reg.URL())
	}
	p, err := reg.Publish(ctx, DiskImage{Repository: "dib/private", Tag: "1", Content: []byte("private image")})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := http.Get(reg.URL() + "/v2/"); err == nil || !errors.As(err, new(x509.UnknownAuthorityError)) {
		t.Errorf("a client without the CA: %v, want an unknown authority", err)
	}
	caPEM, err := os.ReadFile(reg.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CAFile holds no certificate: %s", caPEM)
	}
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	for _, cred := range []*auth.Credential{nil, {Username: "sylva", Password: "wrong"}, {Username: "sylva", Password: "s3cret"}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, reg.URL()+"/v2/dib/private/manifests/1", nil)
		req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
		want := http.StatusUnauthorized
		if cred != nil {
			req.SetBasicAuth(cred.Username, cred.Password)
			if cred.Password == "s3cret" {
				want = http.StatusOK
			}
		}
		resp, err := trusting.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("credentials %+v: %d, want %d", cred, resp.StatusCode, want)
		}
		if want == http.StatusOK && resp.Header.Get("Docker-Content-Digest") != p.ManifestDigest.String() {
			t.Errorf("served digest %s, want %s", resp.Header.Get("Docker-Content-Digest"), p.ManifestDigest)
		}
	}

	reg.Close()
	if _, err := os.Stat(reg.CAFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CA file after Close: %v", err)
	}
	if _, err := trusting.Get(reg.URL() + "/v2/"); err == nil {
		t.Error("the registry still answers after Close")
	}
}

// With a RootDirectory, what was published outlives the registry: a new
// registry on the same directory serves the same manifest and blob.
func TestRootDirectoryOutlivesTheRegistry(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	first, err := Start(ctx, Options{RootDirectory: dir})
	if err != nil {
		t.Fatal(err)
	}
	data := DiskContent(64<<10, 4)
	p, err := first.Publish(ctx, DiskImage{Repository: "dib/kept", Tag: "1", Content: data})
	first.Close()
	if err != nil {
		t.Fatal(err)
	}
	second := startRegistry(t, Options{RootDirectory: dir})
	repo, err := second.Repository("dib/kept")
	if err != nil {
		t.Fatal(err)
	}
	desc, m := fetchManifest(t, repo, "1")
	if desc.Digest != p.ManifestDigest {
		t.Fatalf("manifest %s, published %s", desc.Digest, p.ManifestDigest)
	}
	got, err := content.FetchAll(ctx, repo, m.Layers[0])
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("layer: %d bytes, %v", len(got), err)
	}
}

// ReferrersAPI lists, over several pages after empty ones, the padding and
// then the referrers oras-go and the signer pushed under the tag schema; a
// filter by artifact type keeps only those of the type; a manifest without
// referrers lists none.
func TestReferrersAPI(t *testing.T) {
	ctx := context.Background()
	api := ReferrersAPI{PageSize: 2, Padding: 3, EmptyPages: 2}
	var pages int
	count := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/referrers/") {
				pages++
			}
			next.ServeHTTP(w, r)
		})
	}
	reg := startRegistry(t, Options{Middleware: func(h http.Handler) http.Handler { return count(api.Middleware(h)) }})
	p, err := reg.Publish(ctx, DiskImage{Repository: "dib/signed", Tag: "1", Content: []byte("signed image")})
	if err != nil {
		t.Fatal(err)
	}
	other, err := reg.Publish(ctx, DiskImage{Repository: "dib/signed", Tag: "2", Content: []byte("unsigned image")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range []SignOptions{{Referrer: true}, {Bundle: true}} {
		if err := reg.Sign(ctx, s, "dib/signed", p.ManifestDigest, opts); err != nil {
			t.Fatal(err)
		}
	}
	repo, err := reg.Repository("dib/signed")
	if err != nil {
		t.Fatal(err)
	}
	list := func(d digest.Digest, artifactType string) []string {
		t.Helper()
		desc, err := repo.Resolve(ctx, d.String())
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		if err := repo.Referrers(ctx, desc, artifactType, func(refs []ocispec.Descriptor) error {
			for _, r := range refs {
				types = append(types, r.ArtifactType)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return types
	}
	pages = 0
	got := list(p.ManifestDigest, "")
	want := []string{PaddingArtifactType, PaddingArtifactType, PaddingArtifactType}
	if len(got) != 5 || strings.Join(got[:3], ",") != strings.Join(want, ",") ||
		!(got[3] == cosignReferrerArtType && got[4] == bundleMediaType || got[4] == cosignReferrerArtType && got[3] == bundleMediaType) {
		t.Errorf("referrers %v: want three paddings, then the signature and the bundle", got)
	}
	if pages != 2+3 {
		t.Errorf("%d pages read: want 2 empty, then 3 of at most 2", pages)
	}
	if got := list(p.ManifestDigest, bundleMediaType); len(got) != 1 || got[0] != bundleMediaType {
		t.Errorf("referrers of type %s: %v", bundleMediaType, got)
	}
	if got := list(other.ManifestDigest, cosignReferrerArtType); len(got) != 0 {
		t.Errorf("an unsigned image's signatures: %v", got)
	}
}

// Sign without Referrer tags cosign's signature image sha256-<hex>.sig
// beside the artifact; its payload names the manifest and its signature
// verifies with PublicKeyPEM, unless it was corrupted.
func TestSignTagsAVerifiableSignature(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, Options{})
	s, err := NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey([]byte(s.PublicKeyPEM))
	if err != nil {
		t.Fatal(err)
	}
	repo, err := reg.Repository("dib/sig")
	if err != nil {
		t.Fatal(err)
	}
	for _, corrupt := range []bool{false, true} {
		p, err := reg.Publish(ctx, DiskImage{Repository: "dib/sig", Tag: "1", Content: fmt.Appendf(nil, "an image, its signature corrupted: %v", corrupt)})
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Sign(ctx, s, "dib/sig", p.ManifestDigest, SignOptions{CorruptSignature: corrupt}); err != nil {
			t.Fatal(err)
		}
		_, m := fetchManifest(t, repo, "sha256-"+p.ManifestDigest.Encoded()+".sig")
		if len(m.Layers) != 1 || m.Layers[0].MediaType != cosignSimpleSigning {
			t.Fatalf("signature manifest %+v", m)
		}
		payload, err := content.FetchAll(ctx, repo, m.Layers[0])
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Critical struct {
				Image struct {
					Digest string `json:"docker-manifest-digest"`
				} `json:"image"`
			} `json:"critical"`
		}
		if err := json.Unmarshal(payload, &doc); err != nil || doc.Critical.Image.Digest != p.ManifestDigest.String() {
			t.Errorf("payload %s names %q, want %s", payload, doc.Critical.Image.Digest, p.ManifestDigest)
		}
		sig, err := base64.StdEncoding.DecodeString(m.Layers[0].Annotations[cosignSignatureAnnot])
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(payload)
		if ok := ecdsa.VerifyASN1(pub.(*ecdsa.PublicKey), sum[:], sig); ok == corrupt {
			t.Errorf("corrupt %v: the signature verifies: %v", corrupt, ok)
		}
	}
}
