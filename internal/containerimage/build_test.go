package containerimage

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

var (
	tinyOnce sync.Once
	tinyPath string
	tinyErr  error
)

// tiny is a small static Linux binary, built once for the package's
// tests: Build only reads its ELF header and copies it.
func tiny(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the image carries a Linux binary built here")
	}
	tinyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "containerimage-tiny-")
		if err != nil {
			tinyErr = err
			return
		}
		src := filepath.Join(dir, "main.go")
		if tinyErr = os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); tinyErr != nil {
			return
		}
		tinyPath = filepath.Join(dir, "tiny")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", tinyPath, src)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GO111MODULE=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			tinyErr = &buildError{err: err, out: string(out)}
		}
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if tinyPath != "" {
		os.RemoveAll(filepath.Dir(tinyPath))
	}
	os.Exit(code)
}

// digestOf is a layer's digest as stored.
func digestOf(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string {
	return "building a static binary: " + e.err.Error() + "\n" + e.out
}

// certs is a CA bundle of the test's own: Build only checks that it holds
// a PEM certificate.
func certs(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBuildIsReproducible: the same inputs give the same digest, so that
// a rebuild of a release is checkable; the creation time changes it.
func TestBuildIsReproducible(t *testing.T) {
	o := Options{Binary: tiny(t), CACerts: certs(t), Arch: runtime.GOARCH, Labels: map[string]string{"org.opencontainers.image.version": "v1"}}
	a, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("two builds of the same inputs: %s and %s", da, db)
	}
	o.Created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if dc, _ := c.Digest(); dc == da {
		t.Error("another creation time gives the same digest")
	}
	cfg, err := c.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Created.Equal(o.Created) || cfg.Config.Labels["org.opencontainers.image.version"] != "v1" || cfg.Architecture != runtime.GOARCH || cfg.OS != "linux" {
		t.Errorf("config: created %v, labels %v, platform %s/%s", cfg.Created, cfg.Config.Labels, cfg.OS, cfg.Architecture)
	}
	files, err := Files(c)
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range files {
		if !h.ModTime.Equal(o.Created) {
			t.Errorf("%s has mtime %v, want the creation time", name, h.ModTime)
		}
	}
}

// TestImageFiles: the layer holds the binary, the CA bundle, a nonroot
// user with its own home, and a sticky /tmp, with the modes and owners a
// restricted pod needs.
func TestImageFiles(t *testing.T) {
	bin, ca := tiny(t), certs(t)
	img, err := Build(Options{Binary: bin, CACerts: ca, Arch: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	files, err := Files(img)
	if err != nil {
		t.Fatal(err)
	}
	binSize := fileSize(t, bin)
	for _, c := range []struct {
		name     string
		typ      byte
		mode     int64
		uid      int
		size     int64 // -1: any
		contains string
	}{
		{"osimages", tar.TypeReg, 0o755, 0, binSize, ""},
		{"etc/ssl/certs/ca-certificates.crt", tar.TypeReg, 0o644, 0, fileSize(t, ca), ""},
		{"etc/passwd", tar.TypeReg, 0o644, 0, -1, ""},
		{"home/nonroot", tar.TypeDir, 0o700, UID, -1, ""},
		{"tmp", tar.TypeDir, 0o1777, 0, -1, ""},
	} {
		h, ok := files[c.name]
		if !ok {
			t.Errorf("%s: not in the image", c.name)
			continue
		}
		if h.Typeflag != c.typ || h.Mode != c.mode || h.Uid != c.uid || (c.size >= 0 && h.Size != c.size) {
			t.Errorf("%s: type %c mode %o uid %d size %d; want %c %o %d %d", c.name, h.Typeflag, h.Mode, h.Uid, h.Size, c.typ, c.mode, c.uid, c.size)
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != User || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != DefaultEntrypoint {
		t.Errorf("user %q entrypoint %v", cfg.Config.User, cfg.Config.Entrypoint)
	}
	if !contains(cfg.Config.Env, "SSL_CERT_FILE="+CACertsPath) {
		t.Errorf("env %v does not point Go at the CA bundle", cfg.Config.Env)
	}
}

// TestImageEntrypoint: a binary packed under another name (a manager whose
// Deployment runs /manager) sits there, and the config runs it.
func TestImageEntrypoint(t *testing.T) {
	img, err := Build(Options{Binary: tiny(t), CACerts: certs(t), Arch: runtime.GOARCH, Entrypoint: "/manager"})
	if err != nil {
		t.Fatal(err)
	}
	files, err := Files(img)
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := files["manager"]; !ok || h.Mode != 0o755 {
		t.Errorf("manager: %+v, in the image: %v", h, ok)
	}
	if _, ok := files["osimages"]; ok {
		t.Error("the binary is also at the default entrypoint")
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/manager" {
		t.Errorf("entrypoint %v, want [/manager]", cfg.Config.Entrypoint)
	}
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestBuildRefusesBadInputs: each fault is named with the input it is in.
func TestBuildRefusesBadInputs(t *testing.T) {
	bin := tiny(t)
	notPEM := filepath.Join(t.TempDir(), "bundle.txt")
	if err := os.WriteFile(notPEM, []byte("just text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		o    Options
		says []string
	}{
		{"no binary", Options{Arch: runtime.GOARCH}, []string{"no binary given"}},
		{"not an executable", Options{Binary: notELF, Arch: runtime.GOARCH}, []string{notELF, "not a Linux executable"}},
		{"an unknown architecture", Options{Binary: bin, Arch: "mips"}, []string{`"mips"`, "amd64, arm64"}},
		{"a CA bundle without a certificate", Options{Binary: bin, Arch: runtime.GOARCH, CACerts: notPEM}, []string{notPEM, "no PEM certificate"}},
		{"a missing CA bundle", Options{Binary: bin, Arch: runtime.GOARCH, CACerts: notPEM + ".absent"}, []string{"reading the CA certificates", ".absent"}},
		{"an entrypoint in a folder", Options{Binary: bin, Arch: runtime.GOARCH, Entrypoint: "/usr/bin/manager"}, []string{`"/usr/bin/manager"`, "root folder"}},
		{"a relative entrypoint", Options{Binary: bin, Arch: runtime.GOARCH, Entrypoint: "manager"}, []string{`"manager"`, "root folder"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Build(c.o)
			if err == nil {
				t.Fatal("built")
			}
			for _, s := range c.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

// TestWriteLayoutAndTarball: the layout and the tarball hold the image
// built, under its tag; writing a layout again replaces what it held.
func TestWriteLayoutAndTarball(t *testing.T) {
	img, err := Build(Options{Binary: tiny(t), CACerts: certs(t), Arch: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(t.TempDir(), "layout")
	if err := os.MkdirAll(filepath.Join(dir, "stale"), 0o755); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := WriteLayout(img, dir, "v1.2.3"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "stale")); !os.IsNotExist(err) {
		t.Errorf("what the layout directory held is still there: %v", err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Digest != want || m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1.2.3" {
		t.Fatalf("the layout's index: %+v, want one image %s tagged v1.2.3", m.Manifests, want)
	}

	file := filepath.Join(t.TempDir(), "image.tar")
	if err := WriteTarball(img, file, "registry.example/osimages:v1.2.3"); err != nil {
		t.Fatal(err)
	}
	loaded, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	// docker save's format has a manifest of its own: the config and the
	// layer are the image's.
	wantConfig, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := loaded.ConfigName(); err != nil || got != wantConfig {
		t.Errorf("the tarball's config is %s (%v), want %s", got, err, wantConfig)
	}
	wantLayers, _ := img.Layers()
	gotLayers, err := loaded.Layers()
	if err != nil || len(gotLayers) != 1 {
		t.Fatalf("the tarball's layers: %v %v", gotLayers, err)
	}
	if a, b := digestOf(t, gotLayers[0]), digestOf(t, wantLayers[0]); a != b {
		t.Errorf("the tarball's layer is %s, want %s", a, b)
	}
	if err := WriteTarball(img, file, "not a reference"); err == nil || !strings.Contains(err.Error(), `"not a reference"`) {
		t.Errorf("a bad reference: %v", err)
	}

	size, err := CompressedSize(img)
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	layerSize, _ := layers[0].Size()
	if len(layers) != 1 || size <= layerSize || size > layerSize+8<<10 {
		t.Errorf("compressed size %d for a layer of %d: want the layer, the config and the manifest", size, layerSize)
	}
}
