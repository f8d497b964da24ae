package devregistry

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	sigsig "github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry/remote"
)

// The cosign format, as github.com/sigstore/cosign writes it (pkg/types,
// pkg/oci/static); internal/signature reads the same constants.
const (
	cosignSimpleSigning   = "application/vnd.dev.cosign.simplesigning.v1+json"
	cosignSignatureAnnot  = "dev.cosignproject.cosign/signature"
	cosignReferrerArtType = "application/vnd.dev.cosign.artifact.sig.v1+json"
)

// Signer signs artifacts the way `cosign sign --key` does (key-based, no
// transparency log), with sigstore's libraries: an ECDSA P-256 key, SHA-256,
// a simple-signing payload, and the signature manifest tagged
// sha256-<hex>.sig beside the artifact.
type Signer struct {
	signer sigsig.SignerVerifier
	// PublicKeyPEM is the key to verify with, as cosign.pub holds it (and
	// os_images_oci_registries.<key>.cosign_publickey).
	PublicKeyPEM string
}

// NewSigner makes a fresh key pair, as `cosign generate-key-pair` does.
func NewSigner() (*Signer, error) {
	sv, _, err := sigsig.NewDefaultECDSASignerVerifier()
	if err != nil {
		return nil, err
	}
	pub, err := sv.PublicKey()
	if err != nil {
		return nil, err
	}
	pemData, err := cryptoutils.MarshalPublicKeyToPEM(pub)
	if err != nil {
		return nil, err
	}
	return &Signer{signer: sv, PublicKeyPEM: string(pemData)}, nil
}

// SignOptions vary a signature, to make the faulty ones tests need.
type SignOptions struct {
	// PayloadDigest, when set, is the manifest digest the payload names
	// instead of the one signed for: a signature of another artifact.
	PayloadDigest digest.Digest
	// Referrer attaches the signature as an OCI 1.1 referrer of the
	// artifact (cosign's --registry-referrers-mode=oci-1-1) instead of the
	// sha256-<hex>.sig tag.
	Referrer bool
	// CorruptSignature flips a bit of the signature.
	CorruptSignature bool
	// Bundle writes a Sigstore bundle, as cosign v3's `cosign sign --key`
	// does by default (--new-bundle-format), attached as a referrer,
	// instead of a simple-signing signature.
	Bundle bool
	// TlogEntry, with Bundle, adds a transparency log entry to the bundle,
	// as cosign does when it uploads to Rekor. The entry is made up: a
	// verifier that ignores the log, as `cosign verify
	// --insecure-ignore-tlog=true` does, must not mind it.
	TlogEntry bool
	// PredicateType, with Bundle, is the predicate type of the signed
	// statement instead of cosign's sign/v1: an attestation (cosign attest).
	PredicateType string
}

// Sign signs manifest d of repository (a path on r) and pushes the
// signature. Signing again under the same tag replaces the signature, as a
// re-run of cosign sign with --replace would.
func (r *Registry) Sign(ctx context.Context, s *Signer, repository string, d digest.Digest, opts SignOptions) error {
	repo, err := r.Repository(repository)
	if err != nil {
		return err
	}
	named := d
	if opts.PayloadDigest != "" {
		named = opts.PayloadDigest
	}
	if opts.Bundle {
		return r.signBundle(ctx, s, repo, repository, d, named, opts)
	}
	ref, err := name.NewDigest(r.Host + "/" + repository + "@" + named.String())
	if err != nil {
		return fmt.Errorf("signing %s@%s: %w", repository, d, err)
	}
	// payload.Cosign is the type cosign itself marshals: the same JSON bytes.
	body, err := json.Marshal(payload.Cosign{Image: ref})
	if err != nil {
		return err
	}
	sig, err := s.signer.SignMessage(bytes.NewReader(body))
	if err != nil {
		return err
	}
	if opts.CorruptSignature {
		sig[len(sig)/2] ^= 0x01
	}

	layer := ocispec.Descriptor{
		MediaType:   cosignSimpleSigning,
		Digest:      digest.FromBytes(body),
		Size:        int64(len(body)),
		Annotations: map[string]string{cosignSignatureAnnot: base64.StdEncoding.EncodeToString(sig)},
	}
	if err := repo.Push(ctx, layer, bytes.NewReader(body)); err != nil {
		return fmt.Errorf("pushing the signature payload of %s: %w", repository, err)
	}
	subject := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d}
	if opts.Referrer {
		desc, err := resolveSubject(ctx, repo, d)
		if err != nil {
			return err
		}
		_, err = oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, cosignReferrerArtType, oras.PackManifestOptions{
			Subject: &desc,
			Layers:  []ocispec.Descriptor{layer},
		})
		if err != nil {
			return fmt.Errorf("pushing the signature referrer of %s: %w", repository, err)
		}
		return nil
	}

	// cosign's signature image: an OCI image manifest whose config lists the
	// payload as its only layer.
	config, _ := json.Marshal(map[string]any{
		"architecture": "", "os": "", "config": map[string]any{},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layer.Digest.String()}},
	})
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: int64(len(config))}
	if err := repo.Push(ctx, configDesc, bytes.NewReader(config)); err != nil {
		return fmt.Errorf("pushing the signature config of %s: %w", repository, err)
	}
	m, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_0, "", oras.PackManifestOptions{
		ConfigDescriptor: &configDesc,
		Layers:           []ocispec.Descriptor{layer},
	})
	if err != nil {
		return fmt.Errorf("pushing the signature manifest of %s: %w", repository, err)
	}
	tag := subject.Digest.Algorithm().String() + "-" + subject.Digest.Encoded() + ".sig"
	if err := repo.Tag(ctx, m, tag); err != nil {
		return fmt.Errorf("tagging the signature %s of %s: %w", tag, repository, err)
	}
	return nil
}

func resolveSubject(ctx context.Context, repo *remote.Repository, d digest.Digest) (ocispec.Descriptor, error) {
	desc, err := repo.Resolve(ctx, d.String())
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("resolving %s: %w", d, err)
	}
	return desc, nil
}
