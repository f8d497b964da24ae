package devregistry

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
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
}

// Published is what Publish pushed.
type Published struct {
	// Ref is the reference without scheme: host/repository:tag.
	Ref            string
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
	fields := DiskImageFields(img.Content, img.Repository, img.Gzip)
	layer := img.Content
	if img.Gzip {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
		if _, err := zw.Write(img.Content); err != nil {
			return Published{}, err
		}
		if err := zw.Close(); err != nil {
			return Published{}, err
		}
		layer = buf.Bytes()
	}
	fields[osimage.FieldArchiveSize] = strconv.Itoa(len(layer))
	for k, v := range img.Fields {
		fields[k] = v
	}

	title := fields[osimage.FieldFilename]
	if img.Gzip {
		title += ".gz"
	}
	layerDesc := ocispec.Descriptor{
		MediaType:   ocispec.MediaTypeImageLayer,
		Digest:      digest.FromBytes(layer),
		Size:        int64(len(layer)),
		Annotations: map[string]string{ocispec.AnnotationTitle: title},
	}
	if img.Gzip {
		layerDesc.MediaType = ocispec.MediaTypeImageLayerGzip
	}
	if err := repo.Push(ctx, layerDesc, bytes.NewReader(layer)); err != nil {
		return Published{}, fmt.Errorf("pushing layer of %s: %w", img.Repository, err)
	}

	// A fixed creation time keeps the manifest digest a function of the
	// content, so republishing the same image is a no-op.
	annotations := map[string]string{ocispec.AnnotationCreated: "2026-01-01T00:00:00Z"}
	if !img.NoAnnotations {
		for k, v := range fields {
			annotations[osimage.AnnotationPrefix+k] = v
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
