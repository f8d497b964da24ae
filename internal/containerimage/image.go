// Package containerimage builds the osimages container image without a
// container daemon: one layer on an empty base, holding the static binary,
// the CA certificates and the passwd/group entries of a nonroot user, and an
// OCI config that runs the binary as that user. go-containerregistry writes it
// as an OCI layout directory (pushable with `oras cp --from-oci-layout` or
// `crane push`) and as a tarball (`crane push`, `docker load`).
//
// ko would do the same, but its default base image has to be pulled from the
// internet, which these machines cannot reach; building from scratch also
// keeps the image to exactly what it needs.
package containerimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The nonroot user, as in distroless images, so that PodSecurity's
// "restricted" profile and runAsNonRoot accept the image as it is.
const (
	UID  = 65532
	User = "65532:65532"
	// DefaultEntrypoint is where the binary sits unless Options say otherwise.
	DefaultEntrypoint = "/osimages"
	// CACertsPath is the first place Go's crypto/x509 looks on Linux.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
	// DefaultCACerts is the build machine's bundle (Debian, Ubuntu, Alpine).
	DefaultCACerts = "/etc/ssl/certs/ca-certificates.crt"
)

// Options describe the image.
type Options struct {
	// Binary must be static (CGO_ENABLED=0): the image has no C library.
	Binary string
	// Entrypoint is the binary's path, in the root folder: the e2e tests
	// also pack other projects' managers, at the path their Deployments run.
	Entrypoint string
	// CACerts is a PEM bundle to ship as the system CAs (DefaultCACerts).
	CACerts string
	// Arch is the GOARCH the binary was built for (amd64, arm64); it must
	// match the binary's ELF header.
	Arch string
	// Labels go into the image config (org.opencontainers.image.*).
	Labels map[string]string
	// Created is the creation time in the config and the files' mtime. The
	// zero value gives the Unix epoch, so that the same inputs give the same
	// digest.
	Created time.Time
}

// elfMachine maps GOARCH to the ELF machine of its binaries.
var elfMachine = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// Build returns the image described by o.
func Build(o Options) (v1.Image, error) {
	if o.Binary == "" {
		return nil, errors.New("no binary given")
	}
	if o.CACerts == "" {
		o.CACerts = DefaultCACerts
	}
	if o.Entrypoint == "" {
		o.Entrypoint = DefaultEntrypoint
	}
	if path.Dir(o.Entrypoint) != "/" || path.Base(o.Entrypoint) == "/" {
		return nil, fmt.Errorf("entrypoint %q: want a file of the root folder, such as %s", o.Entrypoint, DefaultEntrypoint)
	}
	if err := checkStatic(o.Binary, o.Arch); err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	certs, err := os.ReadFile(o.CACerts)
	if err != nil {
		return nil, fmt.Errorf("reading the CA certificates: %w", err)
	}
	if !bytes.Contains(certs, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, fmt.Errorf("CA certificates %s: no PEM certificate in it", o.CACerts)
	}
	created := o.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()

	layerTar, err := rootfs(created, path.Base(o.Entrypoint), bin, certs)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("making the layer: %w", err)
	}

	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "osimages containerimage: static binary, CA certificates, nonroot user",
		},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = o.Arch
	cfg.Created = v1.Time{Time: created}
	cfg.Config = v1.Config{
		User:       User,
		Entrypoint: []string{o.Entrypoint},
		WorkingDir: "/",
		Env: []string{
			"PATH=/",
			"SSL_CERT_FILE=" + CACertsPath,
			// The server and the controller write nothing but their data
			// volume; a HOME keeps libraries that look for one quiet.
			"HOME=/home/nonroot",
		},
		Labels: o.Labels,
	}
	return mutate.ConfigFile(img, cfg)
}

// checkStatic refuses a binary that needs a dynamic loader (the image has
// none) or that was built for another architecture than the config says.
func checkStatic(binary, arch string) error {
	f, err := elf.Open(binary)
	if err != nil {
		return fmt.Errorf("binary %s: not a Linux executable: %w", binary, err)
	}
	defer f.Close()
	want, ok := elfMachine[arch]
	if !ok {
		return fmt.Errorf("architecture %q: want one of amd64, arm64, ppc64le, s390x, riscv64", arch)
	}
	if f.Machine != want {
		return fmt.Errorf("binary %s is built for %s, not %s (set GOARCH when building it)", binary, f.Machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("binary %s is dynamically linked: build it with CGO_ENABLED=0, the image has no C library", binary)
		}
	}
	return nil
}

// rootfs is the uncompressed tar of the image's only layer.
func rootfs(mtime time.Time, name string, bin, certs []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, uid int, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: uid, ModTime: mtime, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", UID)
	steps := []func() error{
		func() error { return dir("etc", 0, 0o755) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return dir("etc/ssl", 0, 0o755) },
		func() error { return dir("etc/ssl/certs", 0, 0o755) },
		func() error { return file(CACertsPath[1:], 0o644, certs) },
		func() error { return dir("home", 0, 0o755) },
		func() error { return dir("home/nonroot", UID, 0o700) },
		// A world-writable /tmp with the sticky bit, as every Linux has; with
		// a read-only root filesystem the chart mounts an emptyDir over it.
		func() error { return dir("tmp", 0, 0o1777) },
		func() error { return file(name, 0o755, bin) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, fmt.Errorf("writing the layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img into an OCI image layout directory, replacing what
// it held, with tag as its org.opencontainers.image.ref.name, the name
// `oras cp --from-oci-layout DIR:TAG` and `crane push DIR` go by.
func WriteLayout(img v1.Image, dir, tag string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
	if err != nil {
		return fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	return nil
}

// WriteTarball writes img as a `docker save`-style tarball tagged ref, which
// `crane push FILE REF` and `docker load` take.
func WriteTarball(img v1.Image, file, ref string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return fmt.Errorf("tarball %s: %w", file, err)
	}
	return nil
}

// CompressedSize is what pushing img transfers: its layers as stored, plus
// config and manifest.
func CompressedSize(img v1.Image) (int64, error) {
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return 0, err
		}
		total += n
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return 0, err
	}
	m, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	return total + int64(len(cfg)) + int64(len(m)), nil
}
