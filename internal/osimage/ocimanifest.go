package osimage

import (
	"encoding/json"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// What the image server's OCI distribution API (internal/ocidist) serves
// of an image and render's oci:// URLs name: an artifact of one layer, the
// stored, verified file itself (its digest is sha256:<the catalog's
// sha256>, the checksum Ironic verifies in transit), whose manifest is of
// the image's sha256 and size alone, so that render and the server always
// agree on it whatever filename, key or format a catalog gives the image;
// and per disk type, the index whose annotation tells Ironic the format
// (OCIReference).

// OCIArtifactType marks the manifests as disk-image artifacts (Ironic takes a
// manifest with an artifactType for an artifact, not a container image).
const OCIArtifactType = "application/vnd.osimages.disk-image.v1"

// OCILayerMediaType is the media type of the layer: the image file as
// stored, neither compressed nor archived.
const OCILayerMediaType = "application/octet-stream"

// OCIManifest is the manifest of the image of sum, of size bytes, and its
// digest. Its bytes depend on these two values only.
func OCIManifest(sum SHA256, size int64) ([]byte, digest.Digest) {
	m := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: OCIArtifactType,
		Config:       ocispec.DescriptorEmptyJSON,
		Layers: []ocispec.Descriptor{{
			MediaType: OCILayerMediaType,
			Digest:    OCILayerDigest(sum),
			Size:      size,
			// A title is what oras pull writes a layer to, and Ironic's
			// name for the file: of the sha256, not of a catalog's
			// filename, which may change while the image does not.
			Annotations: map[string]string{ocispec.AnnotationTitle: OCILayerTitle(sum)},
		}},
	}
	// A struct (and a map's sorted keys) marshal the same way every time;
	// of strings and integers only, it cannot fail.
	b, _ := json.Marshal(m)
	return b, digest.FromBytes(b)
}

// OCIDiskTypeAnnotation is the annotation of an index's manifest from which
// Ironic reads the disk format (ironic/common/image_service.py,
// OciImageService._filter_manifests).
const OCIDiskTypeAnnotation = "disktype"

// OCIIndex is the index the tag diskType (one of OCIDiskTypes)
// answers for the image of sum, of size bytes, and its digest: one
// manifest, the image's (OCIManifest), annotated with the disk type. Its
// bytes depend on these three values only.
func OCIIndex(sum SHA256, size int64, diskType string) ([]byte, digest.Digest) {
	manifest, d := OCIManifest(sum, size)
	idx := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType:    ocispec.MediaTypeImageManifest,
			ArtifactType: OCIArtifactType,
			Digest:       d,
			Size:         int64(len(manifest)),
			Annotations:  map[string]string{OCIDiskTypeAnnotation: diskType},
		}},
	}
	b, _ := json.Marshal(idx)
	return b, digest.FromBytes(b)
}

// OCILayerDigest is the digest of the layer of the image of sum: the file's
// own sha256.
func OCILayerDigest(sum SHA256) digest.Digest {
	return digest.NewDigestFromEncoded(digest.SHA256, string(sum))
}

// OCILayerTitle is the file name the layer of the image of sum carries.
func OCILayerTitle(sum SHA256) string { return string(sum) + ".img" }
