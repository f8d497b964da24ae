package serverio

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

func sha(c byte) osimage.SHA256 { return osimage.SHA256(strings.Repeat(string(c), 64)) }

// output is a served set of two images, one available.
func output() osimage.ServedOutput {
	return osimage.ServedOutput{
		Set: osimage.ServedSet{
			sha('a'): {Available: true, ImageKey: "ubuntu"},
			sha('b'): {Available: false, ImageKey: "rocky"},
		},
		Filenames: osimage.ServedFilenames{sha('a'): {"ubuntu.img"}, sha('b'): {"rocky.img"}},
		OCI:       osimage.ServedOCI{sha('a'): {Repository: "osimages/ubuntu", Manifest: osimage.OCILayerDigest(sha('1'))}},
	}
}

// entries lists the names in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestOCIPath(t *testing.T) {
	for in, want := range map[string]string{
		"/x/served.yaml": "/x/served-oci.yaml", "/x/out.yml": "/x/out-oci.yml", "/x/out": "/x/out-oci.yaml", "/x.d/out": "/x.d/out-oci.yaml",
	} {
		if got := OCIPath(in); got != want {
			t.Errorf("OCIPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFilePublisherRoundTrip(t *testing.T) {
	dir := t.TempDir()
	p := FilePublisher{Path: filepath.Join(dir, "served.yaml")}
	ctx := context.Background()

	got, err := p.Published(ctx)
	if err != nil || got == nil || len(got) != 0 {
		t.Fatalf("before any publication: %v, %v; want an empty set", got, err)
	}
	if err := p.Publish(ctx, output()); err != nil {
		t.Fatal(err)
	}
	got, err = p.Published(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := output().Set
	if len(got) != len(want) || got[sha('a')] != want[sha('a')] || got[sha('b')] != want[sha('b')] {
		t.Fatalf("read back %v, want %v", got, want)
	}
	fi, err := os.Stat(p.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644: the file is a values file for anyone to read", fi.Mode().Perm())
	}
	// The file is a values document, as render -f reads it: the filenames
	// are not in it.
	doc, err := os.ReadFile(p.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "capm3_os_image_server_images:") || strings.Contains(string(doc), "ubuntu.img") {
		t.Errorf("the file is not the values document alone:\n%s", doc)
	}
	// The OCI references, beside it (issue 35): what the ConfigMap holds
	// as served-oci.yaml, in file mode too.
	if got := OCIPath(p.Path); got != filepath.Join(dir, "served-oci.yaml") {
		t.Fatalf("OCIPath: %s", got)
	}
	ociDoc, err := os.ReadFile(OCIPath(p.Path))
	if err != nil {
		t.Fatalf("no OCI references beside the served set: %v", err)
	}
	refs, err := osimage.ParseServedOCI(ociDoc)
	if err != nil || len(refs) != 1 || refs[sha('a')] != output().OCI[sha('a')] {
		t.Errorf("the OCI references read back %v, %v; want %v", refs, err, output().OCI)
	}
	if fi, err := os.Stat(OCIPath(p.Path)); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the OCI references: %v, %v; want 0644", fi, err)
	}
	if names := entries(t, dir); len(names) != 2 {
		t.Errorf("the directory holds %v: a temporary file was left", names)
	}

	// A second publication replaces the first whole.
	next := osimage.ServedOutput{Set: osimage.ServedSet{sha('c'): {Available: true, ImageKey: "suse"}}}
	if err := p.Publish(ctx, next); err != nil {
		t.Fatal(err)
	}
	if got, err = p.Published(ctx); err != nil || len(got) != 1 || got[sha('c')].ImageKey != "suse" {
		t.Fatalf("after the second publication: %v, %v", got, err)
	}
	if ociDoc, err := os.ReadFile(OCIPath(p.Path)); err != nil || strings.Contains(string(ociDoc), string(sha('a'))) {
		t.Errorf("the OCI references were not replaced: %v\n%s", err, ociDoc)
	}
	if names := entries(t, dir); len(names) != 2 {
		t.Errorf("the directory holds %v", names)
	}
}

// A set too large for a ConfigMap is refused before anything is written:
// the file published last stays as it was.
func TestFilePublisherRefusesATooLargeSetAndKeepsTheLastFile(t *testing.T) {
	dir := t.TempDir()
	p := FilePublisher{Path: filepath.Join(dir, "served.yaml")}
	ctx := context.Background()
	if err := p.Publish(ctx, output()); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(p.Path)
	if err != nil {
		t.Fatal(err)
	}
	big := osimage.ServedOutput{Set: osimage.ServedSet{}}
	for i := 0; i < 20000; i++ {
		h := []byte(strings.Repeat("0", 64))
		for j, k := 63, i; k > 0; j, k = j-1, k/16 {
			h[j] = "0123456789abcdef"[k%16]
		}
		big.Set[osimage.SHA256(h)] = osimage.ServedImage{Available: true, ImageKey: strings.Repeat("k", 40)}
	}
	err = p.Publish(ctx, big)
	var size *osimage.SizeError
	if !errors.As(err, &size) || !strings.Contains(err.Error(), "the served set") {
		t.Fatalf("publishing %d images: %v, want a SizeError naming the served set", len(big.Set), err)
	}
	after, err := os.ReadFile(p.Path)
	if err != nil || string(after) != string(before) {
		t.Errorf("the file changed after a refused publication (%v)", err)
	}
	if names := entries(t, dir); len(names) != 2 {
		t.Errorf("the directory holds %v", names)
	}
}

// Where the file should be, something else: the errors name the path, and
// nothing is left behind.
func TestFilePublisherOddPaths(t *testing.T) {
	ctx := context.Background()

	t.Run("a directory", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "served.yaml")
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		err := FilePublisher{Path: path}.Publish(ctx, output())
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("publishing onto a directory: %v, want an error naming %s", err, path)
		}
		if names := entries(t, dir); len(names) != 1 {
			t.Errorf("the directory holds %v: a temporary file was left", names)
		}
		if _, err := (FilePublisher{Path: path}).Published(ctx); err == nil {
			t.Error("reading a directory as the published set: no error")
		}
	})

	t.Run("no such directory", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "missing", "served.yaml")
		err := FilePublisher{Path: path}.Publish(ctx, output())
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("publishing into a missing directory: %v, want an error naming %s", err, path)
		}
	})

	t.Run("a symlink", func(t *testing.T) {
		// The link is replaced by the file; what it pointed to is not
		// written through.
		dir := t.TempDir()
		target := filepath.Join(dir, "elsewhere")
		if err := os.WriteFile(target, []byte("someone else's\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "served.yaml")
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
		p := FilePublisher{Path: path}
		if err := p.Publish(ctx, output()); err != nil {
			t.Fatal(err)
		}
		if data, _ := os.ReadFile(target); string(data) != "someone else's\n" {
			t.Errorf("the symlink's target was written: %q", data)
		}
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("the path is not a regular file after publishing: %v %v", fi, err)
		}
		if got, err := p.Published(ctx); err != nil || len(got) != 2 {
			t.Errorf("read back %v, %v", got, err)
		}
	})

	t.Run("not a served set", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "served.yaml")
		if err := os.WriteFile(path, []byte("capm3_os_image_server_images:\n  x: {available: yes, colour: blue}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := (FilePublisher{Path: path}).Published(ctx); err == nil || !strings.Contains(err.Error(), "capm3_os_image_server_images") {
			t.Errorf("reading a document with an unknown field: %v", err)
		}
	})
}
