package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
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

// MaxReferrers bounds the referrers listed for one manifest, and the pages
// read to list them: an image has a handful (signatures, attestations), a
// registry keeps listing those of every re-signing, and one listing
// thousands, or paging for ever, is either broken or hostile.
const MaxReferrers = 1000

// ErrTooManyReferrers is returned, with the referrers read up to the
// bound, when a manifest has more than MaxReferrers referrers or its
// listing takes more than MaxReferrers pages.
var ErrTooManyReferrers = errors.New("too many referrers")

// Referrers lists the manifests of ref's repository that name subject as
// their subject and have the given artifact type (any type when empty),
// through the OCI referrers API, every page of it, or, where the registry
// lacks it, the referrers tag schema (tag sha256-<hex> holding an index). A
// registry with neither answers an empty list. Past MaxReferrers, it returns
// the first MaxReferrers and an error wrapping ErrTooManyReferrers.
func (c *Client) Referrers(ctx context.Context, ref registry.Reference, subject ocispec.Descriptor, artifactType string) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	err := c.Do(ctx, ref, func(repo *remote.Repository) error {
		out = out[:0]
		repo.ReferrerListMaxPages = MaxReferrers
		err := repo.Referrers(ctx, subject, artifactType, func(page []ocispec.Descriptor) error {
			if len(out)+len(page) > MaxReferrers {
				out = append(out, page[:MaxReferrers-len(out)]...)
				return errCut
			}
			out = append(out, page...)
			return nil
		})
		switch {
		case errors.Is(err, errCut):
			return tooManyReferrers(fmt.Sprintf("manifest %s has more than %d referrers, the most osimages reads", subject.Digest, MaxReferrers))
		case errors.Is(err, errdef.ErrTooManyPages):
			return tooManyReferrers(fmt.Sprintf("the referrers of manifest %s take more than %d pages, the most osimages reads", subject.Digest, MaxReferrers))
		}
		return err
	})
	return out, err
}

var errCut = errors.New("referrers cut at the bound")

// tooManyReferrers is ErrTooManyReferrers with what was passed; its
// message does not repeat the sentinel's, which callers name themselves.
type tooManyReferrers string

func (e tooManyReferrers) Error() string        { return string(e) }
func (e tooManyReferrers) Is(target error) bool { return target == ErrTooManyReferrers }
