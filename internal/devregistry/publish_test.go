package devregistry

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// diskContentV1 is DiskContent as it was first written, in memory: the
// streaming version must keep making the same bytes, since tests and demos
// pin digests of them.
func diskContentV1(size int, seed uint64) []byte {
	const mib = 1 << 20
	out := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for off := 0; off < size; off += 4 * mib {
		end := min(off+mib, size)
		for i := off; i < end; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < end; j++ {
				out[i+j] = byte(v >> (8 * j))
			}
		}
	}
	return out
}

func TestDiskContentIsStable(t *testing.T) {
	for _, size := range []int{0, 5, 1 << 20, 1<<20 + 3, 4 << 20, 9<<20 + 12345} {
		if !bytes.Equal(DiskContent(size, 42), diskContentV1(size, 42)) {
			t.Errorf("DiskContent(%d) changed", size)
		}
	}
}

func TestPublishFromFile(t *testing.T) {
	ctx := context.Background()
	reg, err := Start(ctx, Options{RootDirectory: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	dir := t.TempDir()
	data := DiskContent(3<<20+17, 9)
	path := filepath.Join(dir, "img.raw")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	mem, err := reg.Publish(ctx, DiskImage{Repository: "dib/mem", Tag: "1", Content: data, Gzip: true})
	if err != nil {
		t.Fatal(err)
	}

	cases := map[string]DiskImage{
		"raw":            {ContentFile: path},
		"gzipped here":   {ContentFile: path, Gzip: true},
		"gzipped before": {ContentFile: path, Gzip: true},
	}
	if _, err := exec.LookPath("gzip"); err == nil {
		gz := path + ".gz"
		if out, err := exec.Command("sh", "-c", "gzip -1 -c "+path+" > "+gz).CombinedOutput(); err != nil {
			t.Fatalf("gzip: %v: %s", err, out)
		}
		c := cases["gzipped before"]
		c.LayerFile = gz
		cases["gzipped before"] = c
	}
	for name, img := range cases {
		t.Run(name, func(t *testing.T) {
			img.Repository, img.Tag = "dib/mem", "1"
			p, err := reg.Publish(ctx, img)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{osimage.FieldSHA256, osimage.FieldMD5, osimage.FieldSize, osimage.FieldFilename} {
				if p.Fields[f] != mem.Fields[f] {
					t.Errorf("%s = %q, published from memory %q", f, p.Fields[f], mem.Fields[f])
				}
			}
			if p.Fields.Get(osimage.FieldCompression) != map[bool]string{true: "gz"}[img.Gzip] {
				t.Errorf("compression = %q", p.Fields[osimage.FieldCompression])
			}
			repo, _ := reg.Repository("dib/mem")
			rc, err := repo.Blobs().Fetch(ctx, descOf(t, p))
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			if _, err := content.ReadAll(rc, descOf(t, p)); err != nil {
				t.Errorf("layer as stored: %v", err)
			}
		})
	}
}

func descOf(t *testing.T, p Published) ocispec.Descriptor {
	t.Helper()
	n, err := strconv.ParseInt(p.Fields.Get(osimage.FieldArchiveSize), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ocispec.Descriptor{Digest: p.LayerDigest, Size: n}
}
