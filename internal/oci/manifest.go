package oci

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
)

// maxManifestBytes bounds what is read of a manifest; an image manifest with
// one layer is a few KiB.
const maxManifestBytes = 4 << 20

// Manifest is a resolved image manifest.
type Manifest struct {
	Descriptor ocispec.Descriptor
	ocispec.Manifest
}

// FetchManifest resolves uri (oci://host/repo:tag, or a digest) and returns
// its manifest, checked against the digest the registry gave for it.
func (c *Client) FetchManifest(ctx context.Context, uri string) (Manifest, error) {
	ref, err := ParseReference(uri)
	if err != nil {
		return Manifest{}, err
	}
	var out Manifest
	err = c.Do(ctx, ref, func(repo *remote.Repository) error {
		desc, rc, err := repo.FetchReference(ctx, ref.Reference)
		if err != nil {
			return err
		}
		defer rc.Close()
		if desc.Size > maxManifestBytes {
			return fmt.Errorf("manifest is %d bytes, more than the %d an image manifest can be", desc.Size, maxManifestBytes)
		}
		data, err := content.ReadAll(io.LimitReader(rc, maxManifestBytes), desc)
		if err != nil {
			return err
		}
		out.Descriptor = desc
		if err := json.Unmarshal(data, &out.Manifest); err != nil {
			return fmt.Errorf("manifest %s is not JSON: %w", desc.Digest, err)
		}
		return nil
	})
	return out, err
}

// maxReferrers bounds the referrers listed for one manifest: an image has a
// handful (signatures, attestations); a registry listing thousands is either
// broken or hostile.
const maxReferrers = 1000

// Referrers lists the manifests of ref's repository that name subject as
// their subject and have the given artifact type (any type when empty),
// through the OCI referrers API or, where the registry lacks it, the
// referrers tag schema (tag sha256-<hex> holding an index). A registry with
// neither answers an empty list.
func (c *Client) Referrers(ctx context.Context, ref registry.Reference, subject ocispec.Descriptor, artifactType string) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	err := c.Do(ctx, ref, func(repo *remote.Repository) error {
		out = out[:0]
		return repo.Referrers(ctx, subject, artifactType, func(page []ocispec.Descriptor) error {
			if len(out)+len(page) > maxReferrers {
				return fmt.Errorf("manifest %s has more than %d referrers", subject.Digest, maxReferrers)
			}
			out = append(out, page...)
			return nil
		})
	})
	return out, err
}
