package catalog

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
	"github.com/sylva-projects/osimages/internal/values"
)

const dibRepo = "sylva-projects/sylva-elements/diskimage-builder/"

// publish pushes n diskimage-builder-like artifacts named img-00, img-01...
// alternating gzipped and plain layers, and returns what was annotated.
func publish(t *testing.T, reg *devregistry.Registry, n int) map[string]devregistry.Published {
	t.Helper()
	out := map[string]devregistry.Published{}
	for i := range n {
		name := fmt.Sprintf("img-%02d", i)
		p, err := reg.Publish(context.Background(), devregistry.DiskImage{
			Repository: dibRepo + name,
			Tag:        "0.7.6",
			Content:    devregistry.DiskContent(64<<10, uint64(i)),
			Gzip:       i%2 == 0,
			Fields:     osimage.Image{"os": "ubuntu", "os-release": "noble", "k8s-version": "1.32.5+rke2r1", "hardened": "false"},
		})
		if err != nil {
			t.Fatal(err)
		}
		out[name] = p
	}
	return out
}

func dibValues(t *testing.T, reg *devregistry.Registry, insecure bool, names ...string) values.Values {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "sylva_base_oci_registry: oci://%s/sylva-projects\n", reg.Host)
	fmt.Fprintf(&b, "oci_registry_insecure: %v\n", insecure)
	b.WriteString("os_images_oci_registries:\n  sylva:\n    url: '{{ .Values.sylva_base_oci_registry }}/sylva-elements/diskimage-builder'\n    tag: 0.7.6\n")
	b.WriteString("sylva_diskimagebuilder_images:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %s: {os_images_oci_registry: sylva}\n", n)
	}
	return mustParse(t, b.String())
}

func resolveValues(t *testing.T, v values.Values, opts oci.Options) (osimage.Catalog, error) {
	t.Helper()
	plan, err := PlanFromValues(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts.Insecure = opts.Insecure || plan.Insecure
	client, err := oci.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	return Resolve(context.Background(), plan, client, ResolveOptions{Timeout: 5 * time.Second, Signatures: signature.Verifier{Client: client}})
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestResolveManyArtifacts(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publish(t, reg, 24)
	v := dibValues(t, reg, true, keysOf(published)...)
	v["os_images"] = map[string]any{
		// Hand-declared fields win over annotations of the same name.
		"img-03": map[string]any{"image-format": "qcow2", "extra": "kept"},
	}
	cat, err := resolveValues(t, v, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cat) != 24 {
		t.Fatalf("resolved %d images, want 24", len(cat))
	}
	for name, p := range published {
		img := cat[name]
		for k, want := range p.Fields {
			if name == "img-03" && k == "image-format" {
				want = "qcow2"
			}
			if img[k] != want {
				t.Errorf("%s.%s = %q, want %q", name, k, img[k], want)
			}
		}
		if want := "oci://" + p.Ref; img["uri"] != want {
			t.Errorf("%s.uri = %q, want %q", name, img["uri"], want)
		}
		if img["oci-image-registry-key"] != "sylva" {
			t.Errorf("%s has no oci-image-registry-key", name)
		}
		if _, ok := img["compression"]; ok != (p.Fields.Get("compression") == "gz") {
			t.Errorf("%s compression = %q, published %q", name, img["compression"], p.Fields.Get("compression"))
		}
	}
	if cat["img-03"]["extra"] != "kept" {
		t.Errorf("hand-declared field lost: %v", cat["img-03"])
	}
	// Annotations without "sylva" in their key are not image fields.
	if _, ok := cat["img-00"]["org.opencontainers.image.created"]; ok {
		t.Error("a non-sylva annotation became a field")
	}
	if _, ok := cat["img-00"]["created"]; ok {
		t.Error("a non-sylva annotation became a field")
	}
}

func TestResolveReportsEveryFailure(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publish(t, reg, 3)
	if _, err := reg.Publish(context.Background(), devregistry.DiskImage{
		Repository: dibRepo + "bare-image", Tag: "0.7.6", Content: []byte("x"), NoAnnotations: true,
	}); err != nil {
		t.Fatal(err)
	}
	names := append(keysOf(published), "missing-tag", "bare-image")
	_, err := resolveValues(t, dibValues(t, reg, true, names...), oci.Options{})
	var report *ResolveError
	if !errors.As(err, &report) {
		t.Fatalf("want a ResolveError, got %v", err)
	}
	if report.Total != 5 || len(report.Failures) != 2 {
		t.Fatalf("want 2 of 5 failures, got %+v", report)
	}
	byKey := map[string]Failure{}
	for _, f := range report.Failures {
		byKey[f.Key] = f
	}
	if f := byKey["missing-tag"]; !strings.Contains(f.Cause, "tag not found") || !strings.Contains(f.URI, "missing-tag:0.7.6") {
		t.Errorf("missing tag: %+v", f)
	}
	if f := byKey["bare-image"]; !strings.Contains(f.Cause, "no sha256 annotation") {
		t.Errorf("manifest without annotations: %+v", f)
	}
	msg := err.Error()
	for _, want := range []string{"2 of 5 images could not be resolved", "missing-tag (oci://", "bare-image (oci://"} {
		if !strings.Contains(msg, want) {
			t.Errorf("report %q lacks %q", msg, want)
		}
	}
}

// failFirst answers 500 to the first n manifest requests of each path, once
// armed.
func failFirst(n int32, armed *atomic.Bool, seen *sync.Map) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if armed.Load() && strings.Contains(r.URL.Path, "/manifests/") && r.Method == http.MethodGet {
				c, _ := seen.LoadOrStore(r.URL.Path, new(atomic.Int32))
				if c.(*atomic.Int32).Add(1) <= n {
					http.Error(w, "injected failure", http.StatusInternalServerError)
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

func TestResolveRetries5xx(t *testing.T) {
	var seen sync.Map
	var armed atomic.Bool
	reg := testenv.Registry(t, devregistry.Options{Middleware: failFirst(2, &armed, &seen)})
	published := publish(t, reg, 2)
	armed.Store(true)
	cat, err := resolveValues(t, dibValues(t, reg, true, keysOf(published)...), oci.Options{})
	if err != nil {
		t.Fatalf("a registry answering 500 twice then 200 must succeed: %v", err)
	}
	if len(cat) != 2 {
		t.Fatalf("got %d images", len(cat))
	}
	seen.Range(func(path, c any) bool {
		if got := c.(*atomic.Int32).Load(); got != 3 {
			t.Errorf("%s: %d requests, want 3 (two failures, one success)", path, got)
		}
		return true
	})
}

func TestResolveTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	reg := testenv.Registry(t, devregistry.Options{Middleware: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/slow-image/manifests/") {
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			next.ServeHTTP(w, r)
		})
	}})
	published := publish(t, reg, 1)
	plan, err := PlanFromValues(dibValues(t, reg, true, append(keysOf(published), "slow-image")...), nil)
	if err != nil {
		t.Fatal(err)
	}
	client, _ := oci.NewClient(oci.Options{Insecure: true})
	_, err = Resolve(context.Background(), plan, client, ResolveOptions{Timeout: 500 * time.Millisecond})
	var report *ResolveError
	if !errors.As(err, &report) || len(report.Failures) != 1 || !strings.Contains(report.Failures[0].Cause, "timeout") {
		t.Fatalf("want one timeout failure, got %v", err)
	}
}

// An unreachable registry is one cause, said once, with the registry's URL
// and what to check: it read "connection refused: connection refused".
func TestResolveConnectionRefused(t *testing.T) {
	host := testenv.FreeAddr(t) // nothing listens there
	v := mustParse(t, "os_images:\n  gone: {uri: \"oci://"+host+"/sylva-projects/gone:1.0\"}\noci_registry_insecure: true\n")
	_, err := resolveValues(t, v, oci.Options{})
	f, ok := failuresByKey(t, err)["gone"]
	if !ok {
		t.Fatalf("want the image to fail, got %v", err)
	}
	if strings.Count(f.Cause, "connection refused") != 1 {
		t.Errorf("cause says connection refused other than once: %s", f.Cause)
	}
	for _, want := range []string{"connection refused at ", "://" + host, "check the registry's address in the values", "that the registry is running"} {
		if !strings.Contains(f.Cause, want) {
			t.Errorf("cause lacks %q: %s", want, f.Cause)
		}
	}
}

func writeDockerConfig(t *testing.T, host, user, password string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, auth)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestResolveBasicAuth(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{Username: "sylva", Password: "s3cret"})
	published := publish(t, reg, 2)
	v := dibValues(t, reg, true, keysOf(published)...)

	cat, err := resolveValues(t, v, oci.Options{RegistryConfig: writeDockerConfig(t, reg.Host, "sylva", "s3cret")})
	if err != nil || len(cat) != 2 {
		t.Fatalf("with credentials: %v", err)
	}

	_, err = resolveValues(t, v, oci.Options{RegistryConfig: writeDockerConfig(t, reg.Host, "sylva", "wrong")})
	var report *ResolveError
	if !errors.As(err, &report) || len(report.Failures) != 2 || !strings.Contains(report.Failures[0].Cause, "unauthorized") {
		t.Fatalf("with wrong credentials, want unauthorized for both images, got %v", err)
	}
}

func TestResolveTLS(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{TLS: true})
	published := publish(t, reg, 2)
	secure := dibValues(t, reg, false, keysOf(published)...)

	if cat, err := resolveValues(t, secure, oci.Options{CAFile: reg.CAFile}); err != nil || len(cat) != 2 {
		t.Fatalf("with the registry's CA: %v", err)
	}

	_, err := resolveValues(t, secure, oci.Options{})
	var report *ResolveError
	if !errors.As(err, &report) || !strings.Contains(report.Failures[0].Cause, "TLS:") || !strings.Contains(report.Failures[0].Cause, "--ca-file") {
		t.Fatalf("without the CA, want a TLS failure, got %v", err)
	}

	if cat, err := resolveValues(t, dibValues(t, reg, true, keysOf(published)...), oci.Options{}); err != nil || len(cat) != 2 {
		t.Fatalf("oci_registry_insecure skips verification: %v", err)
	}
}

func TestResolveHandDeclaredOCI(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	p := publish(t, reg, 1)["img-00"]
	v := mustParse(t, fmt.Sprintf(`
oci_registry_insecure: true
os_images:
  custom-image:
    uri: oci://%s
    os: custom-os
  web-image:
    uri: https://files.example.org/web.raw
    sha256: 0f3a6f0f7c4c3f4e6b5f0e0d7a1a4c9e8b7d6c5b4a39281706f5e4d3c2b1a090
`, p.Ref))
	cat, err := resolveValues(t, v, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cat["custom-image"]; got["sha256"] != p.Fields.Get("sha256") || got["os"] != "custom-os" || got.Get("oci-image-registry-key") != "" {
		t.Errorf("hand-declared OCI image: %v", got)
	}
	if got := cat["web-image"]; got["uri"] != "https://files.example.org/web.raw" || len(got) != 2 {
		t.Errorf("HTTP image is published as declared: %v", got)
	}
}

// TestCatalogRefusesMalformedSizes: size and archive-size are decimal
// integers of bytes, in annotations (a resolve failure naming the image
// and the annotation) and in os_images (an input error naming the field).
func TestCatalogRefusesMalformedSizes(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	for i, value := range []string{"lots", "2.097152e6", "0x200000", "-5", "99999999999999999999"} {
		name := fmt.Sprintf("bad-size-%d", i)
		if _, err := reg.Publish(context.Background(), devregistry.DiskImage{
			Repository: dibRepo + name, Tag: "0.7.6", Content: devregistry.DiskContent(4<<10, uint64(i)),
			Fields: osimage.Image{osimage.FieldSize: value},
		}); err != nil {
			t.Fatal(err)
		}
		_, err := resolveValues(t, dibValues(t, reg, true, name), oci.Options{})
		var report *ResolveError
		if !errors.As(err, &report) || len(report.Failures) != 1 || report.Failures[0].Key != name ||
			!strings.Contains(report.Failures[0].Cause, fmt.Sprintf("annotation sylvaproject.org/diskimage/size %q is", value)) {
			t.Errorf("size %q: %v; want a failure of %s naming the annotation", value, err, name)
		}
	}

	_, err := PlanFromValues(mustParse(t, `
os_images:
  web-image:
    uri: https://files.example.org/web.raw
    size: lots
    archive-size: "-1"
`), nil)
	if err == nil || !strings.Contains(err.Error(), `os_images.web-image.size "lots" is not a decimal integer`) ||
		!strings.Contains(err.Error(), `os_images.web-image.archive-size "-1" is negative`) {
		t.Errorf("declared sizes: %v", err)
	}
}
