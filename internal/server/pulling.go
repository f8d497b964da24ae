package server

import (
	"context"
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/selection"
	"github.com/sylva-projects/osimages/internal/signature"
)

// PullWith adapts a puller to a PullFunc. choose is asked for the puller at
// each pull, since oci_registry_insecure can change with the values; policy
// likewise gives the signature policy of the management values in force.
// Before any byte of an OCI image is downloaded, the manifest the tag
// resolves to must be the one the image record pins (oci-manifest-digest),
// and must carry a signature made with every key that applies to the image
// (signature.Policy.KeysFor). While policy reports an error, OCI images are
// not pulled at all. A nil policy checks no signature.
func PullWith(choose func() *pull.Puller, policy func() (signature.Policy, error)) PullFunc {
	return func(ctx context.Context, w selection.Wanted, dst *imagestore.Writer, progress func(int64, int64)) (string, int64, error) {
		src := PullSource(w)
		if policy != nil {
			check, err := signatureCheck(w, policy)
			if err != nil {
				return "", 0, err
			}
			src.CheckManifest = check
		}
		res, err := choose().Pull(ctx, src, dst, progress)
		return res.MD5, res.Size, err
	}
}

// signatureCheck is the check of w's manifest that the management values
// ask for, nil when no key applies to it.
func signatureCheck(w selection.Wanted, policy func() (signature.Policy, error)) (func(context.Context, *oci.Client, digest.Digest) error, error) {
	uri := w.Image.Get(osimage.FieldURI)
	if !strings.HasPrefix(uri, "oci://") {
		return nil, nil
	}
	p, err := policy()
	if err != nil {
		return nil, fmt.Errorf("pulling %s: not pulled, since the cosign keys that apply to it cannot be read from the management values: %w", uri, err)
	}
	keys, err := p.KeysRequired(w.Image.Get(osimage.FieldRegistryKey), uri)
	if err != nil {
		return nil, fmt.Errorf("%w (nothing was downloaded)", err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return func(ctx context.Context, client *oci.Client, d digest.Digest) error {
		return keys.Check(ctx, signature.Verifier{Client: client}, uri, d, " of the management values; nothing was downloaded")
	}, nil
}

// PullSource is what the puller needs to know of w.
func PullSource(w selection.Wanted) pull.Source {
	return pull.Source{
		URI:            w.Image.Get(osimage.FieldURI),
		SHA256:         w.SHA256,
		MD5:            w.Image.Get(osimage.FieldMD5),
		Compression:    w.Image.Get(osimage.FieldCompression),
		Size:           w.Int64Field(osimage.FieldSize),
		ArchiveSize:    w.Int64Field(osimage.FieldArchiveSize),
		ManifestDigest: w.Image.Get(osimage.FieldManifestDigest),
	}
}
