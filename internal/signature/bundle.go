package signature

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
	sigsig "github.com/sigstore/sigstore/pkg/signature"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry"

	"github.com/sylva-projects/osimages/internal/oci"
)

// The Sigstore bundle format, as cosign v3 attaches it by default
// (--new-bundle-format): a referrer manifest of artifact type
// application/vnd.dev.sigstore.bundle.v0.3+json whose one layer, of the
// same media type, is the bundle JSON. For an image, the bundle holds a
// DSSE envelope of an in-toto statement whose subject is the image
// manifest digest and whose predicate type is CosignSignPredicateType.
const (
	// BundleMediaTypePrefix starts the artifact type of a bundle referrer
	// and the media type of its layer (v0.1 to v0.3 so far).
	BundleMediaTypePrefix = "application/vnd.dev.sigstore.bundle"
	// CosignSignPredicateType is the predicate type of the statement
	// `cosign sign` signs; `cosign attest` signs others (SBOM, provenance),
	// which vouch for something else than the image and are not signatures.
	CosignSignPredicateType = "https://sigstore.dev/cosign/sign/v1"
	// bundlePredicateAnnotation is the annotation of a bundle referrer that
	// names the predicate type of its statement.
	bundlePredicateAnnotation = "dev.sigstore.bundle.predicateType"
)

// isSignatureBundle says whether a referrer may be a cosign signature in
// bundle format: a bundle that is not announced as an attestation. The
// predicate type is checked again in the signed statement.
func isSignatureBundle(desc ocispec.Descriptor) bool {
	if !strings.HasPrefix(desc.ArtifactType, BundleMediaTypePrefix) {
		return false
	}
	pt, ok := desc.Annotations[bundlePredicateAnnotation]
	return !ok || pt == CosignSignPredicateType
}

// keyMaterial is the trusted material of sigstore-go's verifier for one
// key: the key itself, whatever key hint the bundle gives (the hint is
// not trusted, the signature is), valid at any time, since no timestamp
// is required (cosign verify --insecure-ignore-tlog=true).
func keyMaterial(v sigsig.Verifier) root.TrustedMaterial {
	key := root.NewExpiringKey(v, time.Time{}, time.Time{})
	return root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) { return key, nil })
}

// checkBundleManifest checks every bundle layer of m, as checkManifest
// does the simple-signing ones.
func (v Verifier) checkBundleManifest(ctx context.Context, ref registry.Reference, m oci.Manifest, d digest.Digest, key *PublicKey) ([]verdict, bool) {
	var out []verdict
	for i, layer := range m.Layers {
		if i >= maxLayers {
			break
		}
		if !strings.HasPrefix(layer.MediaType, BundleMediaTypePrefix) {
			continue
		}
		reason, detail := v.checkBundleLayer(ctx, ref, layer, d, key)
		if reason == "" {
			return nil, true
		}
		out = append(out, verdict{where: fmt.Sprintf(", layer %d", i), reason: reason, detail: detail})
	}
	return out, false
}

func (v Verifier) checkBundleLayer(ctx context.Context, ref registry.Reference, layer ocispec.Descriptor, d digest.Digest, key *PublicKey) (Reason, string) {
	body, err := v.Client.ReadBlob(ctx, ref, layer, maxPayloadBytes)
	if err != nil {
		if errors.Is(err, content.ErrMismatchedDigest) || errors.Is(err, content.ErrTrailingData) {
			return ErrMalformed, fmt.Sprintf("bundle blob %s does not match its digest", layer.Digest)
		}
		return ErrMalformed, fmt.Sprintf("bundle blob %s: %v", layer.Digest, err)
	}
	return checkBundle(body, d, key)
}

// checkBundle verifies one Sigstore bundle (JSON) with key, for manifest d.
// sigstore-go does the verification; the second pass without the digest
// only tells a signature by another key from one of another artifact.
func checkBundle(body []byte, d digest.Digest, key *PublicKey) (Reason, string) {
	var b bundle.Bundle
	if err := b.UnmarshalJSON(body); err != nil {
		return ErrMalformed, fmt.Sprintf("not a Sigstore bundle: %v", err)
	}
	vc, err := b.VerificationContent()
	if err != nil {
		return ErrMalformed, fmt.Sprintf("the bundle's verification material: %v", err)
	}
	if vc.Certificate() != nil {
		return ErrOtherKey, "the bundle is signed with a certificate (keyless cosign), not with a key; osimages verifies key-based signatures"
	}
	sc, err := b.SignatureContent()
	if err != nil {
		return ErrMalformed, fmt.Sprintf("the bundle's signature: %v", err)
	}
	var named []string // what the bundle says it signs, for messages
	own := verify.WithoutArtifactUnsafe()
	if env := sc.EnvelopeContent(); env != nil {
		st, err := env.Statement()
		if err != nil {
			return ErrMalformed, fmt.Sprintf("the bundle's DSSE envelope holds no in-toto statement: %v", err)
		}
		if st.GetPredicateType() != CosignSignPredicateType {
			return ErrMalformed, fmt.Sprintf("the bundle's statement has predicate type %q, an attestation rather than a cosign signature (%s)", st.GetPredicateType(), CosignSignPredicateType)
		}
		for _, s := range st.GetSubject() {
			for alg, hex := range s.GetDigest() {
				named = append(named, alg+":"+hex)
			}
		}
	} else if msg := sc.MessageSignatureContent(); msg != nil {
		// The protobuf names (SHA2_256) in the OCI spelling (sha256).
		alg := strings.ToLower(strings.Replace(msg.DigestAlgorithm(), "SHA2_", "SHA", 1))
		named = append(named, alg+":"+hex.EncodeToString(msg.Digest()))
		own = verify.WithArtifactDigest(alg, msg.Digest())
	}

	verifier, err := verify.NewVerifier(key.trusted, verify.WithNoObserverTimestamps())
	if err != nil {
		return ErrMalformed, err.Error()
	}
	want, err := hex.DecodeString(d.Encoded())
	if err != nil {
		return ErrMalformed, err.Error()
	}
	if _, err := verifier.Verify(&b, verify.NewPolicy(verify.WithArtifactDigest(d.Algorithm().String(), want), verify.WithKey())); err == nil {
		return "", ""
	}
	if _, err := verifier.Verify(&b, verify.NewPolicy(own, verify.WithKey())); err != nil {
		return ErrOtherKey, "the bundle's signature does not verify with the key (signed by another key, or the bundle was altered)"
	}
	return ErrOtherDigest, fmt.Sprintf("the signed bundle names %q, the manifest resolved is %s", strings.Join(named, ", "), d)
}
