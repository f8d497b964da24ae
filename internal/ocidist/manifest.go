// Package ocidist serves the image server's verified images through the
// read-only part of the OCI distribution API, for clients that take
// oci:// image URLs (Metal3's BareMetalOperator and Ironic's OCI image
// service): /v2/, and in each image's repository (images/<sha256>, as its
// image URL is /images/<sha256>/<filename>) its manifest by digest or by
// tag (its keys), its blob by digest (with ranges), and its tag list.
//
// Each image is an artifact of one layer, and that layer is the stored,
// verified file itself: its digest is sha256:<the catalog's sha256>, the
// checksum Ironic verifies in transit. The manifest is built from the
// image's sha256 and size alone (Manifest), two facts of its bytes: its
// digest never changes while the image does not, whatever the filename,
// key or format a catalog gives it, so render (from the workload cluster's
// catalog) and the server (from the management cluster's) always agree on
// an image's oci:// URL.
package ocidist

import (
	"encoding/json"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// ArtifactType marks the manifests as disk-image artifacts (Ironic takes a
// manifest with an artifactType for an artifact, not a container image).
const ArtifactType = "application/vnd.osimages.disk-image.v1"

// LayerMediaType is the media type of the layer: the image file as
// stored, neither compressed nor archived.
const LayerMediaType = "application/octet-stream"

// Manifest is the manifest of the image of sum, of size bytes, and its
// digest. Its bytes depend on these two values only.
func Manifest(sum osimage.SHA256, size int64) ([]byte, digest.Digest) {
	m := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactType,
		Config:       ocispec.DescriptorEmptyJSON,
		Layers: []ocispec.Descriptor{{
			MediaType: LayerMediaType,
			Digest:    LayerDigest(sum),
			Size:      size,
			// A title is what oras pull writes a layer to, and Ironic's
			// name for the file: of the sha256, not of a catalog's
			// filename, which may change while the image does not.
			Annotations: map[string]string{ocispec.AnnotationTitle: LayerTitle(sum)},
		}},
	}
	// A struct (and a map's sorted keys) marshal the same way every time;
	// of strings and integers only, it cannot fail.
	b, _ := json.Marshal(m)
	return b, digest.FromBytes(b)
}

// LayerDigest is the digest of the layer of the image of sum: the file's
// own sha256.
func LayerDigest(sum osimage.SHA256) digest.Digest {
	return digest.NewDigestFromEncoded(digest.SHA256, string(sum))
}

// LayerTitle is the file name the layer of the image of sum carries.
func LayerTitle(sum osimage.SHA256) string { return string(sum) + ".img" }

// Reference is the oci:// URL, as Metal3 takes it, of the image of sum, of
// size bytes, on the server at host (host[:port]):
// oci://host/images/<sha256>@sha256:<manifest digest>.
func Reference(host string, sum osimage.SHA256, size int64) osimage.OCIReference {
	_, d := Manifest(sum, size)
	return osimage.OCIReference{Host: host, SHA256: sum, Manifest: d.String()}
}
