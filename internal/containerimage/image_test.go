package containerimage

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	orasoci "oras.land/oras-go/v2/content/oci"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// staticBinary builds osimages as `make image` does.
func staticBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "osimages")
	cmd := exec.Command("go", "build", "-tags", "nodemo", "-trimpath", "-ldflags", "-s -w", "-o", bin, "../../cmd/osimages")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building osimages: %v\n%s", err, out)
	}
	return bin
}

// TestImagePushedToRegistry builds the image as `make image` does, writes the
// OCI layout, pushes it to a registry with oras-go (what `oras cp
// --from-oci-layout` does), and checks what a kubelet would read from the
// registry: the config's user, entrypoint and platform, and the files.
func TestImagePushedToRegistry(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the image carries a Linux binary built here")
	}
	bin := staticBinary(t)
	img, err := Build(Options{Binary: bin, Arch: runtime.GOARCH, Labels: map[string]string{"org.opencontainers.image.title": "osimages"}})
	if err != nil {
		t.Fatal(err)
	}
	size, err := CompressedSize(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image: %.1f MiB compressed", float64(size)/(1<<20))

	dir := filepath.Join(t.TempDir(), "oci")
	if err := WriteLayout(img, dir, "test"); err != nil {
		t.Fatal(err)
	}
	if err := WriteTarball(img, filepath.Join(t.TempDir(), "osimages.tar"), "example.org/osimages:test"); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	reg := testenv.Registry(t, devregistry.Options{})
	repo, err := reg.Repository("sylva-projects/osimages")
	if err != nil {
		t.Fatal(err)
	}
	layoutStore, err := orasoci.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oras.Copy(ctx, layoutStore, "test", repo, "v0.0.1", oras.DefaultCopyOptions); err != nil {
		t.Fatalf("pushing the OCI layout: %v", err)
	}

	// Read back from the registry, not from the layout.
	desc, rc, err := repo.FetchReference(ctx, "v0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := content.ReadAll(rc, desc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	var manifest ocispec.Manifest
	if err := json.Unmarshal(raw, &manifest); err != nil {
		t.Fatal(err)
	}
	if manifest.MediaType != ocispec.MediaTypeImageManifest || manifest.Config.MediaType != ocispec.MediaTypeImageConfig {
		t.Errorf("manifest %s with config %s: want an OCI image", manifest.MediaType, manifest.Config.MediaType)
	}
	if len(manifest.Layers) != 1 {
		t.Errorf("%d layers, want 1", len(manifest.Layers))
	}
	cfgBytes, err := content.FetchAll(ctx, repo, manifest.Config)
	if err != nil {
		t.Fatal(err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(cfgBytes, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (nonroot)", cfg.Config.User)
	}
	if strings.Join(cfg.Config.Entrypoint, " ") != "/osimages" {
		t.Errorf("entrypoint %q, want [/osimages]", cfg.Config.Entrypoint)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if cfg.Config.Labels["org.opencontainers.image.title"] != "osimages" {
		t.Errorf("labels %v", cfg.Config.Labels)
	}

	// The layer as pulled holds exactly the binary, the CAs and the user.
	files, err := Files(img)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for name, h := range files {
		if h.Typeflag != '5' {
			names = append(names, name)
		}
	}
	want := map[string]int64{"osimages": 0o755, "etc/ssl/certs/ca-certificates.crt": 0o644, "etc/passwd": 0o644, "etc/group": 0o644}
	if len(names) != len(want) {
		t.Errorf("files %v, want exactly %v", names, want)
	}
	for name, mode := range want {
		h, ok := files[name]
		if !ok {
			t.Errorf("%s missing from the image", name)
			continue
		}
		if h.Mode != mode || h.Uid != 0 {
			t.Errorf("%s: mode %o uid %d, want %o owned by root (the nonroot user must not be able to change it)", name, h.Mode, h.Uid, mode)
		}
	}
	if h := files["osimages"]; h != nil {
		if st, err := os.Stat(bin); err == nil && st.Size() != h.Size {
			t.Errorf("binary in the image is %d bytes, built %d", h.Size, st.Size())
		}
	}
	layerBlob, err := content.FetchAll(ctx, repo, manifest.Layers[0])
	if err != nil {
		t.Fatalf("the pushed layer cannot be fetched: %v", err)
	}
	if int64(len(layerBlob)) != manifest.Layers[0].Size {
		t.Errorf("layer: %d bytes fetched, manifest says %d", len(layerBlob), manifest.Layers[0].Size)
	}

	// The binary in the image runs: it is the static one, and it answers.
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "serve") {
		t.Errorf("osimages --help: %v\n%s", err, out)
	}
}

// TestBuildRefusesDynamicBinary: the image has no C library, so a binary
// built with cgo would not start in it; Build says so, naming the file.
func TestBuildRefusesDynamicBinary(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs a Linux dynamic executable")
	}
	dyn, err := exec.LookPath("sh")
	if err != nil {
		testenv.Missing(t, "no sh on PATH: the test needs a dynamic executable of this machine")
	}
	dyn, _ = filepath.EvalSymlinks(dyn)
	_, err = Build(Options{Binary: dyn, Arch: runtime.GOARCH})
	if err == nil || !strings.Contains(err.Error(), "dynamically linked") || !strings.Contains(err.Error(), dyn) {
		t.Fatalf("Build(%s) = %v, want a refusal naming it as dynamically linked", dyn, err)
	}
	_, err = Build(Options{Binary: filepath.Join(t.TempDir(), "none"), Arch: runtime.GOARCH})
	if err == nil || !strings.Contains(err.Error(), "none") {
		t.Fatalf("missing binary: %v", err)
	}
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	if other != "" {
		_, err = Build(Options{Binary: dyn, Arch: other})
		if err == nil || !strings.Contains(err.Error(), "not "+other) {
			t.Fatalf("wrong architecture: %v", err)
		}
	}
}
