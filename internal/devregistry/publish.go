package devregistry

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"

	"github.com/klauspost/compress/gzip"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// ArtifactType marks diskimage-builder artifacts made here.
const ArtifactType = "application/vnd.sylva.diskimage.v1"

// DiskImage describes an artifact to publish the way Sylva's
// diskimage-builder does: one layer holding the image file, gzipped or not,
// and the image's metadata as sylvaproject.org/diskimage/* annotations.
type DiskImage struct {
	// Repository is the path of the repository on the registry, such as
	// "sylva-elements/diskimage-builder/ubuntu-noble-plain-rke2-1-32".
	Repository string
	Tag        string
	// Content is the image file as it is to be served.
	Content []byte
	// Gzip publishes the layer as a gzip archive of Content.
	Gzip bool
	// Fields are annotated besides the computed ones (sha256, md5, filename,
	// image-format, size, archive-size, compression), and win over them.
	Fields osimage.Image
	// NoAnnotations publishes a manifest with no annotations at all.
	NoAnnotations bool
	// ContentFile, instead of Content, names the image file: Publish streams
	// it from disk, so that a large image is never held in memory.
	ContentFile string
	// LayerFile, with ContentFile and Gzip, is a gzip archive of ContentFile
	// made beforehand (by gzip -1, say) to push as the layer. Empty means
	// Publish compresses ContentFile itself.
	LayerFile string
	// Layer, when set, is pushed as the layer as it is, in place of one
	// made from Content (which still gives the computed fields): a gzip
	// bomb (GzipBomb), say, with Gzip set.
	Layer []byte
	// LayerSize, when set, is the layer size the manifest announces in
	// place of the true one: a lying manifest.
	LayerSize int64
}

// Published is what Publish pushed.
type Published struct {
	// Ref is the reference without scheme: host/repository:tag.
	Ref string
	// Repository is the path of the repository on the registry.
	Repository     string
	ManifestDigest digest.Digest
	LayerDigest    digest.Digest
	// Fields are the fields annotated on the manifest.
	Fields osimage.Image
}

// Publish pushes img and tags it.
func (r *Registry) Publish(ctx context.Context, img DiskImage) (Published, error) {
	repo, err := r.Repository(img.Repository)
	if err != nil {
		return Published{}, err
	}
	var fields osimage.Image
	var layerDesc ocispec.Descriptor
	var layer io.Reader
	if img.ContentFile != "" {
		var cleanup func()
		fields, layerDesc, layer, cleanup, err = r.fileLayer(img)
		if err != nil {
			return Published{}, fmt.Errorf("publishing %s: %w", img.Repository, err)
		}
		defer cleanup()
	} else {
		fields = DiskImageFields(img.Content, img.Repository, img.Gzip)
		data := img.Content
		if img.Layer != nil {
			data = img.Layer
		} else if img.Gzip {
			var buf bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
			if _, err := zw.Write(img.Content); err != nil {
				return Published{}, err
			}
			if err := zw.Close(); err != nil {
				return Published{}, err
			}
			data = buf.Bytes()
		}
		layerDesc = ocispec.Descriptor{Digest: digest.FromBytes(data), Size: int64(len(data))}
		layer = bytes.NewReader(data)
	}
	fields[osimage.FieldArchiveSize] = strconv.FormatInt(layerDesc.Size, 10)
	for k, v := range img.Fields {
		fields[k] = v
	}

	title := fields.Get(osimage.FieldFilename)
	if img.Gzip {
		title += ".gz"
	}
	layerDesc.MediaType = ocispec.MediaTypeImageLayer
	layerDesc.Annotations = map[string]string{ocispec.AnnotationTitle: title}
	if img.Gzip {
		layerDesc.MediaType = ocispec.MediaTypeImageLayerGzip
	}
	if err := repo.Push(ctx, layerDesc, layer); err != nil {
		return Published{}, fmt.Errorf("pushing layer of %s: %w", img.Repository, err)
	}
	if img.LayerSize != 0 {
		// The registry checks only that the blob exists.
		layerDesc.Size = img.LayerSize
	}

	// A fixed creation time keeps the manifest digest a function of the
	// content, so republishing the same image is a no-op.
	annotations := map[string]string{ocispec.AnnotationCreated: "2026-01-01T00:00:00Z"}
	if !img.NoAnnotations {
		for k, v := range fields {
			annotations[osimage.AnnotationPrefix+k] = fmt.Sprint(v) // annotations are strings
		}
	}
	manifest, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, ArtifactType, oras.PackManifestOptions{
		Layers:              []ocispec.Descriptor{layerDesc},
		ManifestAnnotations: annotations,
	})
	if err != nil {
		return Published{}, fmt.Errorf("pushing manifest of %s: %w", img.Repository, err)
	}
	if err := repo.Tag(ctx, manifest, img.Tag); err != nil {
		return Published{}, fmt.Errorf("tagging %s:%s: %w", img.Repository, img.Tag, err)
	}
	if img.NoAnnotations {
		fields = osimage.Image{}
	}
	return Published{
		Ref:            r.Host + "/" + img.Repository + ":" + img.Tag,
		Repository:     img.Repository,
		ManifestDigest: manifest.Digest,
		LayerDigest:    layerDesc.Digest,
		Fields:         fields,
	}, nil
}

// DiskImageFields computes the fields diskimage-builder annotates for an
// image file: its digests, size, a raw file name derived from the last
// element of repository, and the compression of the layer.
func DiskImageFields(content []byte, repository string, gzipped bool) osimage.Image {
	name := repository
	for i := len(repository) - 1; i >= 0; i-- {
		if repository[i] == '/' {
			name = repository[i+1:]
			break
		}
	}
	s := sha256.Sum256(content)
	m := md5.Sum(content)
	fields := osimage.Image{
		osimage.FieldSHA256:      hex.EncodeToString(s[:]),
		osimage.FieldMD5:         hex.EncodeToString(m[:]),
		osimage.FieldFilename:    name + ".raw",
		osimage.FieldImageFormat: "raw",
		osimage.FieldSize:        strconv.Itoa(len(content)),
	}
	if gzipped {
		fields[osimage.FieldCompression] = "gz"
	}
	return fields
}

// DiskContent returns size bytes that compress like a disk image: one MiB in
// four is random, the rest zeros. The same seed gives the same bytes.
func DiskContent(size int, seed uint64) []byte {
	var buf bytes.Buffer
	buf.Grow(size)
	_ = WriteDiskContent(&buf, int64(size), seed) // a bytes.Buffer does not fail
	return buf.Bytes()
}

// WriteDiskContent writes the bytes of DiskContent(size, seed) to w, a MiB
// at a time, for images too large to hold in memory.
func WriteDiskContent(w io.Writer, size int64, seed uint64) error {
	const mib = 1 << 20
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	random := make([]byte, mib)
	zeros := make([]byte, mib)
	for off := int64(0); off < size; off += 4 * mib {
		n := int(min(mib, size-off))
		for i := 0; i < n; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < n; j++ {
				random[i+j] = byte(v >> (8 * j))
			}
		}
		if _, err := w.Write(random[:n]); err != nil {
			return err
		}
		for z := min(3*mib, size-off-int64(n)); z > 0; z -= mib {
			if _, err := w.Write(zeros[:min(mib, z)]); err != nil {
				return err
			}
		}
	}
	return nil
}

// DiskImageFieldsFrom is DiskImageFields for content read from r.
func DiskImageFieldsFrom(r io.Reader, repository string, gzipped bool) (osimage.Image, error) {
	s, m := sha256.New(), md5.New()
	n, err := io.Copy(io.MultiWriter(s, m), r)
	if err != nil {
		return nil, err
	}
	fields := DiskImageFields(nil, repository, gzipped)
	fields[osimage.FieldSHA256] = hex.EncodeToString(s.Sum(nil))
	fields[osimage.FieldMD5] = hex.EncodeToString(m.Sum(nil))
	fields[osimage.FieldSize] = strconv.FormatInt(n, 10)
	return fields, nil
}

// fileLayer prepares the layer of an image given as a file: its fields, the
// layer's digest and size, and a reader of the layer, all without holding
// the image in memory.
func (r *Registry) fileLayer(img DiskImage) (osimage.Image, ocispec.Descriptor, io.Reader, func(), error) {
	noop := func() {}
	f, err := os.Open(img.ContentFile)
	if err != nil {
		return nil, ocispec.Descriptor{}, nil, noop, err
	}
	fields, err := DiskImageFieldsFrom(f, img.Repository, img.Gzip)
	f.Close()
	if err != nil {
		return nil, ocispec.Descriptor{}, nil, noop, fmt.Errorf("reading %s: %w", img.ContentFile, err)
	}
	layerPath, cleanup := img.ContentFile, noop
	if img.Gzip && img.LayerFile != "" {
		layerPath = img.LayerFile
	} else if img.Gzip {
		if layerPath, err = r.gzipFile(img.ContentFile); err != nil {
			return nil, ocispec.Descriptor{}, nil, noop, err
		}
		cleanup = func() { os.Remove(layerPath) }
	}
	lf, err := os.Open(layerPath)
	if err != nil {
		cleanup()
		return nil, ocispec.Descriptor{}, nil, noop, err
	}
	d := digest.Canonical.Digester()
	size, err := io.Copy(d.Hash(), lf)
	if err == nil {
		_, err = lf.Seek(0, io.SeekStart)
	}
	if err != nil {
		lf.Close()
		cleanup()
		return nil, ocispec.Descriptor{}, nil, noop, fmt.Errorf("reading %s: %w", layerPath, err)
	}
	done := func() { lf.Close(); cleanup() }
	return fields, ocispec.Descriptor{Digest: d.Digest(), Size: size}, lf, done, nil
}

func (r *Registry) gzipFile(path string) (string, error) {
	in, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.CreateTemp(r.tmp, "layer-*.gz")
	if err != nil {
		return "", err
	}
	zw, _ := gzip.NewWriterLevel(out, gzip.BestSpeed)
	_, err = io.Copy(zw, in)
	if err == nil {
		err = zw.Close()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out.Name())
		return "", fmt.Errorf("compressing %s: %w", path, err)
	}
	return out.Name(), nil
}
